"""run.pipeline.ledger: the progress lines, the estimate of what is left, and the report's figures."""
from __future__ import annotations

from golden import fixed_flavour_list
from xla_images.run.pipeline.ledger import Ledger, Phase, Result, table_rows


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_estimate_until_an_image_went_through_every_phase_then_builds_or_tests_bound_it() -> None:
    flavours = list(fixed_flavour_list())[:5]
    clock, lines = Clock(), []
    ledger = Ledger(flavours, lines.append, clock)
    ledger.finished_phase(flavours[0], "build", Phase(100, 5_000_000_000, True))
    ledger.finished_phase(flavours[0], "test", Phase(40, 0, True))
    assert ledger.seconds_left() is None
    ledger.finished_phase(flavours[0], "push", Phase(20, 1, True))
    ledger.settle(flavours[0], Result.PUSHED, "as sha256:x")
    # 4 builds of 100 s one after another, then the last image's test (40) and push (20).
    assert ledger.seconds_left() == 4 * 100 + 40 + 20
    clock.now = 130
    ledger.finished_phase(flavours[1], "build", Phase(100, 1, True))
    assert lines[-1].startswith(f"ship [ 2/5] {flavours[1].tag}")
    assert "elapsed 2m10s" in lines[-1] and "left ~" in lines[-1]


def test_the_report_counts_results_and_bytes_and_the_table_has_a_row_per_image() -> None:
    flavours = list(fixed_flavour_list())[:3]
    ledger = Ledger(flavours, lambda line: None, Clock())
    ledger.finished_phase(flavours[0], "build", Phase(10, 7, True))
    ledger.finished_phase(flavours[0], "push", Phase(1, 3, True, "uploaded 3 bytes"))
    ledger.settle(flavours[0], Result.PUSHED, "as sha256:x")
    ledger.settle(flavours[1], Result.BLOCKED, "no base image for python 3.12", "build.py base --python 3.12")
    document = ledger.to_json()
    assert document["counts"]["pushed"] == 1 and document["counts"]["blocked"] == 1
    assert document["counts"]["not started"] == 1
    assert (document["bytes_built"], document["bytes_pushed"]) == (7, 3)
    rows = table_rows(ledger.results())
    assert [row[0] for row in rows] == [flavour.tag for flavour in flavours]
    assert rows[0][-1] == "uploaded 3 bytes" and rows[1][-1] == "no base image for python 3.12"
