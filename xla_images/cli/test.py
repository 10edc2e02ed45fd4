"""`test`: image checks, the smoke suite and the SBOM of built images (run.checking.image_tests), as a table."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..errors import Failure
from ..generate.plan import Plan
from ..names import REPORTS
from ..run.checking import image_tests
from .common import figure, flavour_filters, in_ci, plan_options, reports_option, say, select


@click.command("test")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@click.option("--tpu", is_flag=True,
              help="Run as on a TPU VM (privileged, host network, 16G shm, PJRT_DEVICE=TPU). Default: PJRT CPU.")
@click.option("--layers", type=click.IntRange(1, 512), default=None,
              help="Decoder layers of the smoke suite's loop-vs-scan compile check (default: the suite's, 16; "
                   "`bench` sweeps 8,16,32).")
@click.option("--checks-only", is_flag=True, help="Only the image checks, not the smoke suite.")
@click.option("--no-restricted", "no_restricted", is_flag=True,
              help="Skip the smoke suite's second run under the restricted profile (docs/running.md).")
@click.option("-k", "keyword", metavar="EXPR", default=None, help="Only image checks matching this pytest -k.")
@reports_option()
@flavour_filters
@plan_options
def test(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], tpu: bool, layers: int | None,
         checks_only: bool, no_restricted: bool, keyword: str | None, reports_dir: Path | None) -> None:
    """Check built images, then run the smoke suite inside each; print a table; exit 1 on any failure.

    \b
    Image checks (pytest + testinfra, reports/<tag>/checks.xml and checks.json): python, torch, torch_xla
    and libtpu versions; ABI label = torch._C._GLIBCXX_USE_CXX11_ABI; `import torch_xla`; labels and env;
    ABI compatibility of every extension; no site CA bundle, pip.conf or credentials in any layer, label or
    history entry; no compiler. Smoke suite (reports/<tag>/smoke.json and smoke.xml): `python -m
    xla_smoke` in a fresh container; then environment, scan and tracing again under the restricted profile
    (arbitrary UID, GID 0, read-only root, tmpfs /tmp, no capabilities, no network; smoke-restricted.json;
    not with --tpu). SBOM: reports/<tag>/sbom.cdx.json (CycloneDX, see `build.py sbom`).

    \b
    Examples:
      build.py test r2.9.0_3.11_cpu
      build.py test --abi cxx11 --python 3.11 --checks-only
    """
    flavours = select(plan, names, filters)
    root = reports_dir or plan.root / REPORTS
    options = image_tests.ImageTestOptions(tpu=tpu, layers=layers, checks_only=checks_only, keyword=keyword,
                                           restricted=not no_restricted)
    results = image_tests.run_image_tests(plan, flavours, options, root, say=say,
                                          on_smoke_line=None if in_ci() else say)
    _print_table(results)
    for result in results:
        if result.sbom_error is not None:
            say(f"{result.flavour.tag}: FAILED sbom: {result.sbom_error}")
    for result in results:
        for line in result.failures():
            say(f"{result.flavour.tag}: FAILED {line}")
    click.echo(f"reports in {root}/<tag>/")
    failed = [result.flavour.tag for result in results if not result.ok]
    if failed:
        raise Failure(f"{len(failed)} of {len(results)} flavour(s) failed: {', '.join(failed)}", rule="image-tests",
                      hint=f"see {root}/<tag>/checks.json and smoke.json")



def _print_table(results: list[image_tests.FlavourTested]) -> None:
    table = Table("flavour", "checks pass/fail/skip", "checks s", "smoke pass/fail/skip", "smoke s",
                  "compile loop/scan", "trace steps/s", "restricted s", "result")
    for result in results:
        flavour, checked, smoked = result.flavour, result.checked, result.smoked
        smoke_counts, smoke_seconds, ratio, trace = "-", "-", "-", "-"
        if smoked is not None:
            summary = smoked.summary
            smoke_counts = (f"{summary.get('passed', 0)}/{summary.get('failed', 0) + summary.get('error', 0)}/"
                            f"{summary.get('skipped', 0)}" if smoked.report else f"exit {smoked.exit_code}")
            smoke_seconds = f"{smoked.seconds:.0f}"
            metrics = smoked.metrics
            ratio = figure(metrics.get("compile_ratio"), "{:.2f}x")
            trace = figure(metrics.get("trace_steps_per_s"), "{:.1f}")
        restricted = result.restricted
        restricted_cell = "-" if restricted is None else f"{restricted.seconds:.0f}" + ("" if restricted.ok else " FAILED")
        ok = checked.ok and (smoked is None or smoked.ok) and (restricted is None or restricted.ok)
        table.add_row(flavour.tag,
                      f"{checked.count('passed')}/{checked.count('failed') + checked.count('error')}/"
                      f"{checked.count('skipped')}",
                      f"{checked.seconds:.0f}", smoke_counts, smoke_seconds, ratio, trace, restricted_cell,
                      "ok" if ok else "FAILED")
    Console(width=200).print(table)
