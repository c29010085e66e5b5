"""mhar-toy's files (docs/checkpoint-format.md): checkpoints, optimizer states and gradient files,
read and written with the refusals of tools/checkpoint.cpp."""

import dataclasses
import json
import math
from typing import Any, Dict, Optional, Tuple
import os

import numpy as np
import torch

from . import safetensors_io as st
from .config import Config, ConfigError
from .model import MharModel, parameter_names

CHECKPOINT_FORMAT = "mhar.checkpoint"
OPTIMIZER_FORMAT = "mhar.optimizer"
GRAD_FORMAT = "mhar.grad"
FORMAT_VERSION = 1


class CheckpointError(Exception):
    """A file mhar cannot use; the message names the file and what is wrong (a command line tool
    prints it and exits with status 2, as mhar-toy does for a usage error)."""


def resolve_checkpoint_path(path: str) -> str:
    """A run directory stands for its checkpoint.safetensors."""
    path = os.fspath(path)
    return os.path.join(path, "checkpoint.safetensors") if os.path.isdir(path) else path


def _read(path, what, check=None):
    try:
        return st.load(path, check)
    except st.FormatError as e:
        raise CheckpointError("cannot load %s: %s" % (what, e)) from None


def param_count(cfg: Config) -> int:
    """Scalars a model of this config holds (tools/memory.cpp, param_count)."""
    d, hd, L = cfg.d, cfg.head_dim, cfg.L
    per_layer = 2 * d + d * cfg.n_head * hd * 2 + d * cfg.n_kv_head * hd * 2 + 3 * d * cfg.ffn
    n = cfg.vocab * d + L * per_layer + d
    if cfg.routed:
        n += 2 * cfg.n_sites * d
    if cfg.mode == "delta":
        n += d + 2 * L
    return n


def memory_shortfall(cfg: Config, processes: int = 1) -> Optional[str]:
    """Where the parameters alone, with their gradients and AdamW's two moments (16 bytes a
    parameter in float32, in each of `processes` on this machine), exceed the memory available:
    a sentence saying so, else None. A floor, not an estimate (the activations come on top): it
    turns a model that the kernel would kill, or swap for minutes, into one line before a tensor
    is allocated, as mhar-toy's require_memory (tools/memory.h) does."""
    from .data import memory_available
    have, n = memory_available(), param_count(cfg)
    need = 16.0 * n * processes
    if have is None or need <= have:
        return None
    return ("d = %d, L = %d, ffn = %d has %.3g parameters: with their gradients and AdamW's "
            "moments at least %.3g GiB%s, this machine has %.3g GiB available; choose a smaller "
            "model" % (cfg.d, cfg.L, cfg.ffn, n, need / 2**30,
                       "" if processes == 1 else " for %d processes" % processes, have / 2**30))


def expected_shapes(cfg):
    """name → shape of every tensor a checkpoint of this config holds, in checkpoint order."""
    d, hd = cfg.d, cfg.head_dim
    shapes = {"embed": (cfg.vocab, d)}
    for l in range(cfg.L):
        p = "layers.%d." % l
        shapes.update({p + "attn_norm": (1, d), p + "wq": (d, cfg.n_head * hd),
                       p + "wk": (d, cfg.n_kv_head * hd), p + "wv": (d, cfg.n_kv_head * hd),
                       p + "wo": (cfg.n_head * hd, d), p + "mlp_norm": (1, d),
                       p + "w_gate": (d, cfg.ffn), p + "w_up": (d, cfg.ffn),
                       p + "w_down": (cfg.ffn, d)})
    shapes["final_norm"] = (1, d)
    if cfg.routed:
        shapes["route.q"] = (cfg.n_sites, d)
        shapes["route.g"] = (cfg.n_sites, d)
    if cfg.mode == "delta":
        shapes["delta.null"] = (1, d)
        shapes["delta.gate"] = (1, 2 * cfg.L)
    assert list(shapes) == parameter_names(cfg)
    return shapes


def _shape_str(shape):
    return "×".join(str(s) for s in shape)


def _take(tensors, name, shape, path, dtypes=("F32", "F64")):
    """Tensor `name` with `shape`, all finite, or a CheckpointError naming it."""
    t = tensors.get(name)
    if t is None:
        raise CheckpointError("%s: tensor '%s' is missing (checkpoint of another mode or size?)"
                              % (path, name))
    if t.ndim != 2 or tuple(t.shape) != tuple(shape):
        raise CheckpointError("%s: tensor '%s' is %s, the config expects %s"
                              % (path, name, _shape_str(t.shape), _shape_str(shape)))
    if t.dtype.kind != "f":
        raise CheckpointError("%s: tensor '%s' has dtype %s; only F32 and F64 convert to float"
                              % (path, name, t.dtype))
    bad = np.flatnonzero(~np.isfinite(t.reshape(-1)))
    if len(bad):
        i = int(bad[0])
        raise CheckpointError("%s: tensor '%s' holds a non-finite value (%s) at element %d "
                              "(row %d, column %d); refusing to load it"
                              % (path, name, t.reshape(-1)[i], i, i // shape[1], i % shape[1]))
    return t


def _meta(metadata, key, path, what="an mhar checkpoint"):
    if key not in metadata:
        raise CheckpointError("%s: not %s (metadata has no '%s')" % (path, what, key))
    return metadata[key]


_INT_MAX = 2 ** 31 - 1
_LOWEST = {"vocab": 2, "H": 0}  # every other integer field is at least 1


def _config_from_metadata(metadata, path, in_file=None):
    """The config in the metadata, each field an exact integer in range (32.5, true, 1e3 and 2^63
    are refused, not coerced), compared with the `in_file` scalars of the header before the
    config is walked: a d or L far beyond the file is refused at once (tools/checkpoint.cpp)."""
    try:
        cj = st.parse_json_strict(_meta(metadata, "config", path), path,
                                  "the config in the metadata")
    except st.FormatError as e:
        raise CheckpointError(str(e)) from None
    where = "%s: bad model config" % path
    if not isinstance(cj, dict):
        raise CheckpointError("%s: not a JSON object" % where)
    for name in ("vocab", "d", "L", "n_head", "n_kv_head", "ffn", "T", "H", "n_blocks"):
        if name not in cj:
            raise CheckpointError("%s: '%s' is missing" % (where, name))
        v, lo = cj[name], _LOWEST.get(name, 1)
        if type(v) is not int:
            raise CheckpointError("%s: '%s' must be an integer written without a fraction or "
                                  "exponent, got %s" % (where, name, json.dumps(v)[:40]))
        if not lo <= v <= _INT_MAX:
            raise CheckpointError("%s: '%s' = %d is out of range [%d, %d]"
                                  % (where, name, v, lo, _INT_MAX))
    if "mode" not in cj or not isinstance(cj["mode"], str):
        raise CheckpointError("%s: 'mode' must be a string" % where)
    at_least = cj["vocab"] * cj["d"] + 3 * cj["L"] * cj["d"] * cj["ffn"]
    if in_file is not None and at_least > in_file:
        raise CheckpointError("%s: the config (d = %d, L = %d, ffn = %d, mode %s) has %d "
                              "parameters, the file's tensors hold %d"
                              % (path, cj["d"], cj["L"], cj["ffn"], cj["mode"][:40], at_least,
                                 in_file))
    try:
        return Config.from_dict(cj, path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def _step(metadata, path):
    s = _meta(metadata, "step", path)
    if not (0 < len(s) <= 18 and all("0" <= c <= "9" for c in s)):
        raise CheckpointError("%s: the step '%s' in the metadata is not a decimal integer (digits "
                              "only, at most 18)" % (path, s[:40]))
    return int(s)


def _check_format(metadata, path, fmt, what):
    """format, format_version and step of a checkpoint or an optimizer state."""
    found = _meta(metadata, "format", path, what)
    if found != fmt:
        raise CheckpointError("%s: not %s (format '%s')" % (path, what, found[:40]))
    version = _meta(metadata, "format_version", path, what)
    if version != str(FORMAT_VERSION):
        raise CheckpointError("%s: format version '%s' is not supported (this build reads version "
                              "%d)" % (path, version[:40], FORMAT_VERSION))
    return _step(metadata, path)


def _numel(entries):
    total = 0
    for _, _, shape, _, _ in entries:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


@dataclasses.dataclass
class Checkpoint:
    cfg: Config
    model: MharModel
    step: int
    metadata: dict


def load_checkpoint(path: str, dtype: torch.dtype = torch.float32, device=None) -> "Checkpoint":
    """Reads a checkpoint (a file or a run directory) into a MharModel of `dtype`. Refuses, with a
    CheckpointError naming the file, what mhar-toy refuses: not safetensors (every rule of
    docs/checkpoint-format.md), another format or format version, a step that is not a decimal
    integer, a bad config, tensors that do not match it (missing, extra, another shape),
    non-finite values. The config is checked against the header before a tensor is read."""
    path = resolve_checkpoint_path(path)
    found = {}

    def check(metadata, entries):
        found["step"] = _check_format(metadata, path, CHECKPOINT_FORMAT, "an mhar checkpoint")
        in_file = _numel(entries)
        cfg = _config_from_metadata(metadata, path, in_file)
        for name, _, shape, _, _ in entries:
            if name == "embed" and tuple(shape) != (cfg.vocab, cfg.d):
                raise CheckpointError("%s: the config says vocab × d = %d×%d, but tensor 'embed' "
                                      "is %s" % (path, cfg.vocab, cfg.d, _shape_str(shape)))
        if in_file != param_count(cfg):
            raise CheckpointError("%s: the config (d = %d, L = %d, ffn = %d, mode %s) has %d "
                                  "parameters, the file's tensors hold %d"
                                  % (path, cfg.d, cfg.L, cfg.ffn, cfg.mode, param_count(cfg),
                                     in_file))
        expected = len(parameter_names(cfg))
        if len(entries) != expected:
            raise CheckpointError("%s: holds %d tensors, a '%s' model has %d"
                                  % (path, len(entries), cfg.mode, expected))
        found["cfg"] = cfg

    metadata, tensors = _read(path, "checkpoint", check)
    cfg, step = found["cfg"], found["step"]
    shapes = expected_shapes(cfg)
    model = MharModel(cfg, seed=None, dtype=dtype)
    with torch.no_grad():
        for name, p in model.checkpoint_parameters():
            t = _take(tensors, name, shapes[name], path)
            # float32 as stored (an F64 tensor is rounded to float first, as mhar-toy loads it)
            p.copy_(torch.from_numpy(t.astype(np.float32)).to(dtype))
    if device is not None:
        model.to(device)
    return Checkpoint(cfg, model, step, metadata)


def save_checkpoint(path: str, model: MharModel, step: int = 0,
                    extra: Optional[Dict[str, str]] = None) -> None:
    """Writes `model` as mhar-toy's checkpoint (float32, checkpoint order, config and step in the
    metadata), atomically. `extra`: more metadata (mhar-toy train writes 'seed')."""
    metadata = dict(extra or {})
    metadata.update({"format": CHECKPOINT_FORMAT, "format_version": str(FORMAT_VERSION),
                     "config": model.cfg.to_json(), "step": str(int(step))})
    tensors = {name: p.detach().to("cpu", torch.float32).numpy()
               for name, p in model.checkpoint_parameters()}
    st.save(path, tensors, metadata)


def save_optimizer(path: str, cfg: Config, m: Dict[str, Any], v: Dict[str, Any], step: int) -> None:
    """AdamW's moments (dicts name → tensor) as mhar-toy's optimizer.safetensors."""
    tensors = {}
    for prefix, moments in (("m.", m), ("v.", v)):
        for name in parameter_names(cfg):
            tensors[prefix + name] = moments[name].detach().to("cpu", torch.float32).numpy()
    st.save(path, tensors, {"format": OPTIMIZER_FORMAT, "format_version": str(FORMAT_VERSION),
                            "step": str(int(step))})


def load_optimizer(path: str, cfg: Config, dtype: torch.dtype = torch.float32) -> Tuple[Dict[str, Any], Dict[str, Any], int]:
    """(m, v, step) from an optimizer.safetensors, each moment shaped as its parameter. Refuses
    another format or format version, a tensor more or less than m. and v. of each parameter, a
    non-finite value, and a negative second moment."""
    path = os.fspath(path)
    shapes = expected_shapes(cfg)
    found = {}

    def check(metadata, entries):
        found["step"] = _check_format(metadata, path, OPTIMIZER_FORMAT, "an mhar optimizer state")
        if len(entries) != 2 * len(shapes):
            raise CheckpointError("%s: holds %d tensors, the model's optimizer state has %d (m. "
                                  "and v. of each parameter)" % (path, len(entries),
                                                                  2 * len(shapes)))

    metadata, tensors = _read(path, "optimizer state", check)
    m = {n: torch.from_numpy(_take(tensors, "m." + n, s, path).astype(np.float32)).to(dtype)
         for n, s in shapes.items()}
    v = {}
    for n, s in shapes.items():
        t = _take(tensors, "v." + n, s, path)
        bad = np.flatnonzero(t.reshape(-1) < 0)
        if len(bad):
            raise CheckpointError("%s: tensor 'v.%s' holds a negative second-moment value (%s) at "
                                  "element %d; refusing to load it"
                                  % (path, n, t.reshape(-1)[bad[0]], bad[0]))
        v[n] = torch.from_numpy(t.astype(np.float32)).to(dtype)
    return m, v, found["step"]


@dataclasses.dataclass
class GradFile:
    cfg: Config
    precision: str
    loss: float
    tokens: np.ndarray   # B × T, int64
    targets: np.ndarray  # B × T, int64
    params: dict         # name → array (float64 or float32, as written)
    grads: dict


def load_grad_file(path: str) -> "GradFile":
    """A `mhar-toy grad` file: the batch, the loss, the parameters and every gradient."""
    path = os.fspath(path)
    metadata, tensors = _read(path, "gradient file")
    fmt = _meta(metadata, "format", path, "an mhar gradient file")
    if fmt != GRAD_FORMAT:
        raise CheckpointError("%s: not an mhar gradient file (format '%s')" % (path, fmt))
    version = _meta(metadata, "format_version", path, "an mhar gradient file")
    if version != str(FORMAT_VERSION):
        raise CheckpointError("%s: gradient file format version %s is not supported (this build "
                              "reads version %d)" % (path, version, FORMAT_VERSION))
    cfg = _config_from_metadata(metadata, path, sum(t.size for t in tensors.values()))
    shapes = expected_shapes(cfg)
    for name in ("tokens", "targets", "loss"):
        if name not in tensors:
            raise CheckpointError("%s: tensor '%s' is missing" % (path, name))
    params = {n: _take(tensors, "param." + n, s, path) for n, s in shapes.items()}
    grads = {n: _take(tensors, "grad." + n, s, path) for n, s in shapes.items()}
    loss = float(tensors["loss"].reshape(()))
    if not math.isfinite(loss):
        raise CheckpointError("%s: the loss is %s" % (path, loss))
    return GradFile(cfg, metadata.get("precision", "?"), loss, tensors["tokens"],
                    tensors["targets"], params, grads)
