"""A run directory that a kill cannot break, as mhar-toy keeps one (tools/run_dir.h,
docs/checkpoint-format.md "A run directory after a kill"): one writer at a time (an exclusive
flock on DIR/.lock, the lock mhar-toy takes, so mhar-toy and mhar-train-ddp also exclude each
other), the checkpoint and the optimizer state committed together, and what a killed writer left
cleared before a run resumes.

The commit of step s, in three renames, each atomic (safetensors_io.write_atomic):
  1. optimizer.next.safetensors <- the moments of step s
  2. checkpoint.safetensors     <- the parameters of step s   (the commit point)
  3. optimizer.safetensors      <- optimizer.next.safetensors
A kill before 2 leaves the pair of an earlier step intact (and a next file that `recover_state`
discards); a kill between 2 and 3 leaves checkpoint s with optimizer.next of step s, which
`recover_state` renames into place.
"""

import errno
import fcntl
import os
import re
from typing import Dict, Optional

from . import safetensors_io as st
from .checkpoint import CheckpointError, _step, save_checkpoint, save_optimizer

CHECKPOINT_FILE = "checkpoint.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_NEXT_FILE = "optimizer.next.safetensors"
LOCK_FILE = ".lock"


class RunDirBusy(Exception):
    """Another process holds the run directory's lock (mhar-train-ddp exits 2)."""


class DirLock:
    """An exclusive lock on `folder` (which must exist) for `what`: flock on folder/.lock, which
    holds the holder's pid. Released by `release()` or when the process ends, however it ends."""

    def __init__(self, folder: str, what: str) -> None:
        path = os.path.join(folder, LOCK_FILE)
        self.fd: Optional[int] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(self.fd, 200, 0).decode("utf-8", "replace").strip()
            self.release()
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise RunDirBusy("'%s' is in use by another process (%s); one process at a time may "
                             "write a run directory: wait for it to finish or stop it (nothing "
                             "was changed here)" % (folder, holder or "pid unknown")) from None
        note = ("pid %d, %s\n" % (os.getpid(), what)).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, note, 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None


_STALE = re.compile(r"\.tmp-[0-9]+$")


def remove_stale_temporaries(folder: str) -> int:
    """Removes the "<name>.tmp-<pid>" files a killed writer left in `folder` and below (call with
    the lock held: no other writer is at work there). Returns how many it removed."""
    removed = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if _STALE.search(name):
                try:
                    os.unlink(os.path.join(root, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


def step_of(path: str) -> int:
    """The step in a checkpoint's or optimizer state's metadata (its header only is read)."""
    f, size = st.open_regular(path)
    with f:
        metadata, _, _ = st.read_header(f, path, size)
    return _step(metadata, path)


def commit_state(folder: str, model, m: Dict, v: Dict, step: int,
                 extra: Optional[Dict[str, str]] = None) -> None:
    """Commits the checkpoint and the optimizer state of `step` together (the renames above)."""
    nxt = os.path.join(folder, OPTIMIZER_NEXT_FILE)
    save_optimizer(nxt, model.cfg, m, v, step)                                 # 1
    save_checkpoint(os.path.join(folder, CHECKPOINT_FILE), model, step, extra)  # 2: the commit
    os.replace(nxt, os.path.join(folder, OPTIMIZER_FILE))                      # 3
    st.fsync_dir(folder)


def recover_state(folder: str) -> None:
    """Finishes or discards a commit that a kill interrupted (call with the lock held, before
    loading): afterwards the checkpoint and the optimizer state hold the same step, or neither
    exists."""
    nxt = os.path.join(folder, OPTIMIZER_NEXT_FILE)
    if not os.path.exists(nxt):
        return
    ckpt = os.path.join(folder, CHECKPOINT_FILE)
    try:
        same = os.path.exists(ckpt) and step_of(nxt) == step_of(ckpt)
    except (st.FormatError, CheckpointError):
        same = False  # a damaged file is not a commit's
    if same:
        os.replace(nxt, os.path.join(folder, OPTIMIZER_FILE))  # a kill came between 2 and 3
    else:
        os.unlink(nxt)  # a kill came before 2: the older pair stands
    st.fsync_dir(folder)
