"""What every check gets: the run's options, the image's expectations and the suite-level figures to fill."""
from __future__ import annotations

import dataclasses
from typing import Any

from xla_smoke.expectations import Expectations

DEFAULT_LAYERS = (32,)
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
