"""mhar_torch: the PyTorch twin of mhar's reference model (reference/model.cpp), with the same
config, parameter names and files as mhar-toy. See docs/pytorch.md.

    from mhar_torch import Config, MharModel, load_checkpoint, save_checkpoint, depth_route

Routing: ``depth_route`` / ``DepthRouting`` (one site, the readable reference) and
``DepthRoutingStack`` / ``SourceStack`` (every site of a model over one shared source buffer,
the fast version MharModel uses by default).
"""

from .checkpoint import (Checkpoint, CheckpointError, GradFile, load_checkpoint, load_grad_file,
                         load_optimizer, memory_shortfall, param_count, resolve_checkpoint_path,
                         save_checkpoint, save_optimizer)
from .config import Config, ConfigError
from .model import MharModel, decays, parameter_names, site_groups, site_names, site_slots
from .routing import DepthRouting, depth_route
from .routing_stack import DepthRoutingStack, SourceStack

__all__ = [
    "Checkpoint", "CheckpointError", "Config", "ConfigError", "DepthRouting", "DepthRoutingStack",
    "GradFile",
    "MharModel", "decays", "depth_route", "load_checkpoint", "load_grad_file", "load_optimizer",
    "memory_shortfall", "param_count", "parameter_names", "resolve_checkpoint_path",
    "save_checkpoint", "save_optimizer", "site_groups", "site_names", "site_slots", "SourceStack",
]
