"""`bench`: the compile sweep (loop vs scan_layers) and tracing speed of built images (run.checking.bench), side by side."""
from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .. import extras
from ..errors import ConfigError, Failure
from ..generate.plan import Plan
from ..names import REPORTS
from ..run.checking import bench as benching
from ..run.building.build import require_built
from .common import figure, in_ci, plan_options, reports_option, say, select


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
        image = require_built(flavour)
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
                          figure(result.trace_steps_per_s, "{:.1f}") if first else "",
                          figure(result.trace_steps_per_s_iqr, "{:.1f}") if first else "")
        if not result.sweep:
            table.add_row(result.tag, "-", "-", "-", "-", figure(result.trace_steps_per_s, "{:.1f}"),
                          figure(result.trace_steps_per_s_iqr, "{:.1f}"))
    Console(width=200).print(table)
