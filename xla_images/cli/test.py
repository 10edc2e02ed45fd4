"""`test` and `bench`: image checks and the smoke suite against built images, and the compile/tracing bench."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from .. import extras
from ..errors import ConfigError, Failure
from ..generate.plan import Plan
from ..model.target import Target
from ..names import REPORTS, local_ref
from ..run import bench as benching, checks, engine, smoke_runner
from .common import flavour_filters, in_ci, plan_options, reports_option, say, select
from .sbom import write_report as sbom_report


@click.command("test")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@click.option("--tpu", is_flag=True,
              help="Run as on a TPU VM (privileged, host network, 16G shm, PJRT_DEVICE=TPU). Default: PJRT CPU.")
@click.option("--layers", type=click.IntRange(1, 512), default=None,
              help="Decoder layers of the smoke suite's loop-vs-scan compile check (default: the suite's, 32).")
@click.option("--checks-only", is_flag=True, help="Only the image checks, not the smoke suite.")
@click.option("-k", "keyword", metavar="EXPR", default=None, help="Only image checks matching this pytest -k.")
@reports_option()
@flavour_filters
@plan_options
def test(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], tpu: bool, layers: int | None,
         checks_only: bool, keyword: str | None, reports_dir: Path | None) -> None:
    """Check built images, then run the smoke suite inside each; print a table; exit 1 on any failure.

    \b
    Image checks (pytest + testinfra, reports/<tag>/checks.xml and checks.json): python, torch, torch_xla
    and libtpu versions; ABI label = torch._C._GLIBCXX_USE_CXX11_ABI; `import torch_xla`; labels and env;
    ABI compatibility of every extension; no site CA bundle, pip.conf or credentials in any layer, label or
    history entry; no compiler. Smoke suite (reports/<tag>/smoke.json and smoke.xml): `python -m
    xla_smoke` in a fresh container. SBOM: reports/<tag>/sbom.cdx.json (CycloneDX, see `build.py sbom`).

    \b
    Examples:
      build.py test r2.9.0_3.11_cpu
      build.py test --abi cxx11 --python 3.11 --checks-only
    """
    flavours = select(plan, names, filters)
    root = reports_dir or plan.root / REPORTS
    ca_bundle = plan.site.ca_bundle()
    rows = []
    sbom_failed: dict[str, str] = {}
    for flavour in flavours:
        image = _built_image(flavour)
        say(f"== {flavour.tag}: image checks on {image}")
        checked = checks.run(checks.CheckTarget(flavour, image, ca_bundle, tpu), root / flavour.tag,
                             keyword=keyword, quiet=True)
        smoked = None
        if not checks_only:
            say(f"== {flavour.tag}: smoke suite ({'TPU' if tpu else 'PJRT CPU'})")
            smoked = smoke_runner.run(flavour, image, root / flavour.tag, tpu=tpu,
                                      layers=[layers] if layers else None,
                                      on_line=None if in_ci() else say)
        rows.append((flavour, checked, smoked))
        try:
            say(f"== {flavour.tag}: SBOM {sbom_report(plan, flavour, image, root / flavour.tag)}")
        except Failure as error:
            sbom_failed[flavour.tag] = error.message
    _print_table(rows)
    failed = [flavour.tag for flavour, checked, smoked in rows
              if not checked.ok or (smoked and not smoked.ok) or flavour.tag in sbom_failed]
    for tag, message in sbom_failed.items():
        say(f"{tag}: FAILED sbom: {message}")
    for flavour, checked, smoked in rows:
        for line in checked.failures() + (smoked.failures() if smoked else []):
            say(f"{flavour.tag}: FAILED {line}")
    click.echo(f"reports in {root}/<tag>/")
    if failed:
        raise Failure(f"{len(failed)} of {len(rows)} flavour(s) failed: {', '.join(failed)}", rule="image-tests",
                      hint=f"see {root}/<tag>/checks.json and smoke.json")


def _built_image(flavour: Target) -> str:
    image = local_ref(flavour.tag)
    labels = engine.images.image_labels(image)
    if labels is None:
        raise Failure(f"{image} is not built", rule="image-built", hint=f"build it: `build.py build {flavour.tag}`")
    return image


def _fmt(value: Any, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _print_table(rows: list[tuple[Target, checks.ChecksResult, smoke_runner.SmokeResult | None]]) -> None:
    table = Table("flavour", "checks pass/fail/skip", "checks s", "smoke pass/fail/skip", "smoke s",
                  "compile loop/scan", "trace steps/s", "result")
    for flavour, checked, smoked in rows:
        smoke_counts, smoke_seconds, ratio, trace = "-", "-", "-", "-"
        if smoked is not None:
            summary = smoked.summary
            smoke_counts = (f"{summary.get('passed', 0)}/{summary.get('failed', 0) + summary.get('error', 0)}/"
                            f"{summary.get('skipped', 0)}" if smoked.report else f"exit {smoked.exit_code}")
            smoke_seconds = f"{smoked.seconds:.0f}"
            metrics = smoked.metrics
            ratio = _fmt(metrics.get("compile_ratio"), "{:.2f}x")
            trace = _fmt(metrics.get("trace_steps_per_s"), "{:.1f}")
        ok = checked.ok and (smoked is None or smoked.ok)
        table.add_row(flavour.tag,
                      f"{checked.count('passed')}/{checked.count('failed') + checked.count('error')}/"
                      f"{checked.count('skipped')}",
                      f"{checked.seconds:.0f}", smoke_counts, smoke_seconds, ratio, trace,
                      "ok" if ok else "FAILED")
    Console(width=200).print(table)


@click.command("bench")
@click.argument("names", nargs=-1, required=True, metavar="FLAVOUR...")
@click.option("--layers", "layers_text", default="8,16,32", show_default=True, metavar="N,N,...",
              help="Decoder layer counts for the loop-vs-scan compile sweep.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per flavour instead of the table.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Write a PNG of compile time vs layer count (loop and scan lines per flavour). Needs the "
                   "'plot' extra: pip install 'xla-images[plot]'.")
@click.option("--tpu", is_flag=True, help="Run as on a TPU VM (see `test --tpu`).")
@reports_option()
@plan_options
def bench(plan: Plan, names: tuple[str, ...], layers_text: str, as_json: bool, plot_path: Path | None, tpu: bool,
          reports_dir: Path | None) -> None:
    """Compile sweep (loop vs scan_layers) and tracing speed of several images, side by side.

    \b
    Runs the smoke suite's compile_time and tracing checks in each image, one image at a time (they would
    share the cores otherwise), and writes reports/<tag>/bench.json.

    \b
    Examples:
      build.py bench r2.9.0_3.11_cpu r2.6.0_3.11_cpu --layers 8,16,32 --plot compile.png
      build.py bench latest_cpu --json
    """
    if plot_path is not None:
        extras.require("plot")  # before the sweep: it takes minutes per image
    layers = _layer_list(layers_text)
    flavours = select(plan, names, {})
    root = reports_dir or plan.root / REPORTS
    results = []
    for flavour in flavours:
        image = _built_image(flavour)
        say(f"== {flavour.tag}: compile sweep {','.join(map(str, layers))} and tracing")
        results.append(benching.run(flavour, image, layers, root / flavour.tag, tpu=tpu,
                                    on_line=None if (in_ci() or as_json) else say))
    if plot_path is not None:
        benching.plot(results, plot_path)
        say(f"plot written to {plot_path}")
    if as_json:
        click.echo(json.dumps([result.to_json() for result in results], indent=2))
    else:
        _print_bench_table(results)
    broken = [result.tag for result in results if not result.complete]
    if broken:
        raise Failure(f"no complete figures for {', '.join(broken)}", rule="bench",
                      hint="see reports/<tag>/bench.json and smoke output above")


def _layer_list(text: str) -> list[int]:
    try:
        layers = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        layers = []
    if not layers or layers[0] < 1:
        raise ConfigError(f"--layers {text!r} is not a list of positive integers", location="--layers",
                          rule="bench-layers", hint="for example --layers 8,16,32")
    return layers


def _print_bench_table(results: list[benching.BenchResult]) -> None:
    table = Table("flavour", "layers", "compile loop s", "compile scan s", "ratio", "trace steps/s (median)",
                  "IQR")
    for result in results:
        for index, point in enumerate(result.sweep):
            first = index == 0
            table.add_row(result.tag if first else "", str(point.layers), f"{point.loop_s:.1f}",
                          f"{point.scan_s:.1f}", f"{point.ratio:.2f}x",
                          _fmt(result.trace_steps_per_s, "{:.1f}") if first else "",
                          _fmt(result.trace_steps_per_s_iqr, "{:.1f}") if first else "")
        if not result.sweep:
            table.add_row(result.tag, "-", "-", "-", "-", _fmt(result.trace_steps_per_s, "{:.1f}"),
                          _fmt(result.trace_steps_per_s_iqr, "{:.1f}"))
    Console(width=200).print(table)
