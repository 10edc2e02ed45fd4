"""The checks, in the order they run. Each module has `run(context) -> Outcome`.

The registry names modules rather than importing them, so `--list` and flag validation need no torch.
"""
from __future__ import annotations

import importlib
from typing import Callable

# name -> (module under xla_smoke.checks, one-line description for --list)
CHECKS: dict[str, tuple[str, str]] = {
    "environment": ("environment", "python/torch/torch_xla/libtpu versions, C++ ABI and device match the image"),
    "scan": ("scan", "scan results and gradients equal an eager loop; a second call does not recompile"),
    "scan_layers": ("scan_layers", "scan_layers outputs and gradients equal a plain loop over decoder layers"),
    "compile_time": ("compile_time", "compile seconds of a loop vs scan_layers over N decoder layers (fwd+bwd)"),
    "host_offload": ("host_offload", "place_to_host/place_to_device lower to annotate_device_placement calls"),
    "host_offload_exec": ("host_offload", "host offload inside forward+backward gives correct values (TPU only)"),
    "tracing": ("tracing", "traced steps per second of a tracing-bound model with a cached graph"),
    "torchvision": ("companions", "torchvision (when installed) imports; nms and a resize on the XLA device"),
    "torchaudio": ("companions", "torchaudio (when installed) imports; two functional ops on the XLA device"),
}

# Checks whose module holds more than one check name the function to call; the rest use `run`.
ENTRY_POINTS: dict[str, str] = {"host_offload": "run_lowering", "host_offload_exec": "run_execution",
                                 "torchvision": "run_torchvision", "torchaudio": "run_torchaudio"}


def names() -> list[str]:
    return list(CHECKS)


def entry_point(name: str) -> Callable:
    module_name, _ = CHECKS[name]
    module = importlib.import_module(f"xla_smoke.checks.{module_name}")
    return getattr(module, ENTRY_POINTS.get(name, "run"))
