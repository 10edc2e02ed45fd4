"""The one place that knows how torch_xla's API differs between the releases we ship (2.6 ... 2.9).

Everything else in the suite calls these functions. Differences are detected by feature (hasattr,
inspect.signature), not by comparing version strings, so a release we have not seen yet takes the newest path
it supports.

Known differences:
- device / step barrier: `torch_xla.device()` and `torch_xla.sync()` are the current spelling (all of
  2.6 ... 2.9 have them); the older `xm.xla_device()` / `xm.mark_step()` are deprecated and the fallback.
- device kind: `xm.xla_device_hw(device)`; the private `_XLAC._xla_real_devices` it wraps is the fallback.
- `scan(..., is_fn_pure=)` and `scan_layers(..., is_layer_pure=)` exist only from 2.8.
- HLO text of pending lazy tensors: `torch_xla._XLAC._get_xla_tensors_hlo`; `_get_xla_tensors_text` (the
  lazy IR, without frontend attributes) is the last resort.
- float32 matmul precision: `torch_xla.backends.set_mat_mul_precision` (2.9 has it, 2.6 does not), else
  `torch_xla._XLAC._xla_set_mat_mul_precision` (2.6), in old releases `_xla_set_use_full_mat_mul_precision`.
- metrics: `torch_xla.debug.metrics.metric_data(name)` returns None until the metric was first recorded, else
  `(count, accumulator, samples)`; the accumulator of CompileTime is nanoseconds.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

COMPILE_TIME_METRIC = "CompileTime"


def version() -> str:
    return str(getattr(torch_xla, "__version__", "unknown"))


def device() -> torch.device:
    if hasattr(torch_xla, "device"):
        return torch_xla.device()
    return xm.xla_device()


def sync() -> None:
    """Cut the lazy graph here and dispatch it (asynchronously)."""
    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:
        xm.mark_step()


def wait_device_ops() -> None:
    """Block until everything dispatched so far has executed; timings that end without this lie."""
    xm.wait_device_ops()


def device_kind(xla_device: Optional[torch.device] = None) -> str:
    """`CPU`, `TPU`, `CUDA`, ... of the device torch_xla really opened.

    Asks the runtime for the real device behind the xla device, which initialises the PJRT client: a device
    that cannot be opened raises here. (`torch_xla.runtime.device_type()` only echoes PJRT_DEVICE.)
    """
    xla_device = xla_device if xla_device is not None else device()
    if hasattr(xm, "xla_device_hw"):
        return str(xm.xla_device_hw(xla_device)).upper()
    return str(torch_xla._XLAC._xla_real_devices([str(xla_device)])[0]).split(":")[0].upper()


def use_highest_matmul_precision() -> str:
    """Run float32 matmuls at full precision and return the precision now in force.

    The checks compare with eager CPU torch at float32 tolerances; a TPU by default runs float32 matmuls with
    bfloat16 passes, which would fail those comparisons for no fault of the image. The CPU is unaffected.
    """
    try:
        from torch_xla import backends
    except ImportError:
        backends = None
    if backends is not None and hasattr(backends, "set_mat_mul_precision"):
        backends.set_mat_mul_precision("highest")
        return "highest"
    setter = getattr(torch_xla._XLAC, "_xla_set_mat_mul_precision", None)
    if setter is not None:
        setter("highest")
        return "highest"
    legacy = getattr(torch_xla._XLAC, "_xla_set_use_full_mat_mul_precision", None)
    if legacy is not None:
        legacy(use_full_mat_mul_precision=True)
        return "highest"
    return "default"


@dataclasses.dataclass(frozen=True)
class CompileStats:
    """Totals of torch_xla's CompileTime metric since the process started."""

    count: int
    total_ns: int

    def since(self, earlier: "CompileStats") -> "CompileStats":
        return CompileStats(self.count - earlier.count, self.total_ns - earlier.total_ns)

    @property
    def seconds(self) -> float:
        return self.total_ns / 1e9


def compile_stats() -> CompileStats:
    data = met.metric_data(COMPILE_TIME_METRIC)
    if data is None:
        return CompileStats(0, 0)
    count, accumulator = data[0], data[1]
    return CompileStats(int(count), int(accumulator))


def _accepts(function: Callable, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def _scan_function() -> Callable:
    from torch_xla.experimental.scan import scan
    return scan


def _scan_layers_function() -> Callable:
    from torch_xla.experimental.scan_layers import scan_layers
    return scan_layers


def scan_supports_purity() -> bool:
    return _accepts(_scan_function(), "is_fn_pure")


def scan(fn: Callable, init: Any, xs: Any, *, pure: bool = False, partition_fn: Optional[Callable] = None) -> Any:
    """`torch_xla.experimental.scan.scan`; `pure` is passed as is_fn_pure where the release has it (2.8+)."""
    function = _scan_function()
    kwargs: dict[str, Any] = {}
    if partition_fn is not None:
        kwargs["partition_fn"] = partition_fn
    if pure and _accepts(function, "is_fn_pure"):
        kwargs["is_fn_pure"] = True
    return function(fn, init, xs, **kwargs)


def scan_layers(layers: Iterable[torch.nn.Module], input_data: Any, *, pure: bool = False) -> Any:
    """`torch_xla.experimental.scan_layers.scan_layers`; `pure` -> is_layer_pure where it exists (2.8+)."""
    function = _scan_layers_function()
    kwargs: dict[str, Any] = {}
    if pure and _accepts(function, "is_layer_pure"):
        kwargs["is_layer_pure"] = True
    return function(list(layers), input_data, **kwargs)


def hlo_text(tensors: Sequence[torch.Tensor]) -> tuple[str, str]:
    """HLO text of the pending graph that computes `tensors`, without executing it.

    Returns (text, which API produced it). Only HLO text carries the custom calls' frontend attributes;
    the lazy-IR fallback exists so a release without the HLO dumper fails a check with a readable text
    instead of an AttributeError.
    """
    tensors = list(tensors)
    for name in ("_get_xla_tensors_hlo", "_get_xla_tensors_text"):
        dumper = getattr(torch_xla._XLAC, name, None)
        if dumper is not None:
            return dumper(tensors), name
    raise RuntimeError("this torch_xla has neither _get_xla_tensors_hlo nor _get_xla_tensors_text")


def host_offload_ops() -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """(place_to_host, place_to_device) from torch_xla.experimental.stablehlo_custom_call."""
    from torch_xla.experimental.stablehlo_custom_call import place_to_device, place_to_host
    return place_to_host, place_to_device
