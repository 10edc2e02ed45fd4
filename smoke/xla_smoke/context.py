"""What every check gets: the run's options, the image's expectations and the suite-level figures to fill."""
from __future__ import annotations

import dataclasses
from typing import Any

from xla_smoke.expectations import Expectations

# 16 layers: the fewest at which scan_layers pays off on every release with room to spare, so `test` stays near a
# minute per image; the 8/16/32 sweep is `bench`'s. On 2.9's XLA:CPU scan_layers loses below ~12 layers (host,
# 2026-12-07: loop/scan compile 0.5x at 8 layers, 1.4x at 12, 2.9x at 16, 3.3x at 24), so fewer layers would
# make the check fail on a healthy image, and more would only cost time (the loop's compile grows ~1.2-1.5 CPU
# seconds per layer, scan_layers' stays ~flat).
DEFAULT_LAYERS = (16,)
DEFAULT_TRACE_REPEATS = 7
# The margin scan_layers must win by at DEFAULT_LAYERS, from CompileTime ratios measured at 16 layers: 2.9 2.1-2.3x
# in the images (cpu, tpuvm: docs/figures.md), 1.58-3.37x in five runs on the host beside other jobs (load 4-10;
# in CPU seconds 1.5-1.8x, scan's tracing included); 2.6-2.8 6.5-11x. A scan_layers that stops paying off (its
# body compiled once per layer, as the loop's is, plus its own stacking) lands below 1x: where it does not pay
# off on 2.9, at 1, 2 and 8 layers, it measured 0.5-0.74x. 1.2x is about the geometric middle of the two sides
# (0.74x and 1.58x): ~30% of room each way, as much as one healthy figure moved between runs on a shared machine.
DEFAULT_MIN_COMPILE_RATIO = 1.2


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
