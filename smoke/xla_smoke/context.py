"""What every check gets: the run's options, the image's expectations and the suite-level figures to fill."""
from __future__ import annotations

import dataclasses
from typing import Any

from xla_smoke.expectations import Expectations

# 16 layers keep `test`'s smoke suite within a minute per image (loop ~19 s vs scan_layers ~3 s compile on the
# 2.9 image, docs/figures.md) and still fail when scan_layers stops paying off; the 8/16/32 sweep is `bench`'s.
DEFAULT_LAYERS = (16,)
DEFAULT_TRACE_REPEATS = 7
DEFAULT_MIN_COMPILE_RATIO = 1.0


@dataclasses.dataclass
class Context:
    expectations: Expectations
    layers: tuple[int, ...] = DEFAULT_LAYERS
    trace_repeats: int = DEFAULT_TRACE_REPEATS
    min_compile_ratio: float = DEFAULT_MIN_COMPILE_RATIO
    # Filled by the runner before the first check (see checks.environment.probe).
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Suite-level figures (report["metrics"]); the compile_time and tracing checks fill them.
    suite_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def headline_layers(self) -> int:
        """The layer count the suite-level compile figures and the ratio threshold refer to: the largest."""
        return max(self.layers)
