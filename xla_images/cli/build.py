"""`build`: build flavour images on the Docker engine (run.building.build), with a live or plain progress display."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Iterator

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from .. import settings, userfiles
from ..errors import Failure
from ..generate.plan import Plan
from ..model.target import Target
from ..run.building import build as building
from ..run.building.groups import build_order
from .common import flavour_filters, in_ci, interrupts_on_sigterm, plan_options, reports_option, select

FAILURE_TAIL_LINES = 25


@click.command("build")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@click.option("-j", "--jobs", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Flavours built at the same time.")
@click.option("--keep-going", is_flag=True,
              help="Go on with the other flavours when one fails (summary at the end; exit 1 if any failed). "
                   "Without it no new build starts after the first failure.")
@click.option("--force", is_flag=True, help="Rebuild even when the image already has the flavour's id.")
@click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="PEM bundle the build's pip trusts (default: site ca_bundle, i.e. PIP_CERT, SSL_CERT_FILE or "
                   "REQUESTS_CA_BUNDLE). Used in the wheels stage only; never in the image.")
@click.option("--wheelhouse", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Host folder with locked wheels to put in the context (default: wheelhouse/).")
@reports_option("reports/<tag>/build.log files")
@click.option("--prune-cache", is_flag=True,
              help="After the last image of each release+python, drop the engine's unused build cache (~7.5 GB "
                   "per real flavour) so a disk-bound runner can build many; later builds of those images then "
                   "start from pip.")
@flavour_filters
@plan_options
def build(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], jobs: int, keep_going: bool,
          force: bool, ca_bundle: Path | None, wheelhouse: Path | None, reports_dir: Path | None,
          prune_cache: bool) -> None:
    """Build flavour images on the Docker engine as xla-images:<tag> (+ aliases).

    \b
    Several images are built in the pipeline's order (release, python, cpu before tpuvm, each runtime image
    before its devel image), so what they share is built once; `ship` builds, tests and pushes them as one plan.
    A flavour whose image already carries its content-addressed id is skipped (seconds); --force rebuilds.
    Needs the committed lock (`build.py lock TAG`) and a base image (see `build.py doctor`). The output of
    each build goes to reports/<tag>/build.log. An image is tagged only after its build succeeded: a failed
    or interrupted (Ctrl-C, SIGTERM) build tags nothing and leaves no containers; an earlier good image keeps
    its tag.

    \b
    Examples:
      build.py build r2.9.0_3.11_cpu
      build.py build --python 3.11 --abi cxx11 --jobs 2 --keep-going
      build.py build --keep-going --prune-cache      # every flavour, on a disk-bound runner
    """
    # The pipeline's order: images that share layers one after another (`ship` also tests and pushes them).
    flavours = build_order(select(plan, names, filters))
    options = building.BuildOptions(jobs=jobs, keep_going=keep_going, force=force, ca_bundle=ca_bundle,
                                    wheelhouse=wheelhouse, reports_dir=reports_dir, prune_cache=prune_cache,
                                    builder=settings.read_builder())
    console = Console(stderr=True)
    live = console.is_terminal and not in_ci()
    with interrupts_on_sigterm(), _reporter(console, live) as reporter:
        results = building.build_flavours(plan, flavours, options, reporter)
    if len(results) > 1 or any(result.outcome is not building.Outcome.SKIPPED for result in results):
        _print_summary(results, live)
    failed = [result for result in results if result.outcome is building.Outcome.FAILED]
    if failed:
        raise Failure(f"{len(failed)} of {len(results)} flavour(s) failed: "
                      f"{', '.join(result.flavour.tag for result in failed)}", rule="build",
                      hint="the log of each is reports/<tag>/build.log")


# --- display ------------------------------------------------------------------------------------------------

class _PlainReporter:
    """CI logs: one line per step and per result; the full output is in each build.log."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()

    def state(self, flavour: Target, text: str) -> None:
        self._say(f"[{flavour.tag}] {text}")

    def finished(self, result: building.FlavourResult) -> None:
        self._say(f"[{result.flavour.tag}] {_result_text(result)}")
        if result.outcome is building.Outcome.FAILED:
            self._say(_log_tail(result))

    def notice(self, text: str) -> None:
        self._say(text)

    def _say(self, text: str) -> None:
        with self._lock:
            click.echo(text, err=True)


class _LiveReporter:
    """A terminal: one live row per flavour (spinner, current step, elapsed time)."""

    def __init__(self, console: Console) -> None:
        # The tag never wraps or shrinks; the step text takes what is left and ends in an ellipsis.
        self.progress = Progress(SpinnerColumn(),
                                 TextColumn("[bold]{task.fields[tag]}", table_column=Column(no_wrap=True)),
                                 TextColumn("{task.description}", markup=False,
                                            table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
                                 TimeElapsedColumn(), console=console, transient=False, expand=True)
        self._tasks: dict[str, TaskID] = {}
        self._lock = threading.Lock()

    def _task(self, flavour: Target) -> TaskID:
        with self._lock:
            if flavour.tag not in self._tasks:
                self._tasks[flavour.tag] = self.progress.add_task("", tag=flavour.tag, total=None)
            return self._tasks[flavour.tag]

    def state(self, flavour: Target, text: str) -> None:
        self.progress.update(self._task(flavour), description=_shorten(text, 90))

    def finished(self, result: building.FlavourResult) -> None:
        task = self._task(result.flavour)
        self.progress.update(task, description=_result_text(result), total=1, completed=1)
        self.progress.stop_task(task)
        if result.outcome is building.Outcome.FAILED:
            self.progress.console.print(_log_tail(result), markup=False, highlight=False)

    def notice(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)


@contextlib.contextmanager
def _reporter(console: Console, live: bool) -> Iterator[building.Reporter]:
    if not live:
        yield _PlainReporter(console)
        return
    reporter = _LiveReporter(console)
    with reporter.progress:
        yield reporter


def _result_text(result: building.FlavourResult) -> str:
    size = f", {result.size_bytes / 1e9:.2f} GB" if result.size_bytes else ""
    if result.outcome is building.Outcome.BUILT:
        return f"built in {result.seconds:.0f} s ({result.image_id[7:19] if result.image_id else '?'}{size})"
    if result.outcome is building.Outcome.SKIPPED:
        return f"up to date ({result.image_id[7:19] if result.image_id else '?'}{size})"
    if result.outcome is building.Outcome.FAILED:
        return f"FAILED after {result.seconds:.0f} s: {_shorten(result.message, 200)}"
    return result.outcome.value


def _log_tail(result: building.FlavourResult) -> str:
    if result.log is None or not result.log.is_file():
        return f"  {result.message}"
    lines = userfiles.tail_lines(result.log, FAILURE_TAIL_LINES)  # only the log's end is read, however long
    return "\n".join([f"  --- last lines of {result.log} ---", *("  " + line for line in lines)])


def _print_summary(results: list[building.FlavourResult], live: bool) -> None:
    if live:
        table = Table("flavour", "result", "seconds", "image", "size", "base")
        for result in results:
            table.add_row(result.flavour.tag, result.outcome.value, f"{result.seconds:.1f}",
                          (result.image_id or "")[7:19], f"{result.size_bytes / 1e9:.2f} GB" if result.size_bytes
                          else "", result.base_image or "")
        Console(stderr=True).print(table)
        return
    for result in results:
        click.echo(f"{result.flavour.tag:32} {result.outcome.value:12} {result.seconds:8.1f} s  "
                   f"{(result.image_id or '-')[7:19]:12} {result.size_bytes / 1e9:6.2f} GB  "
                   f"{result.base_image or ''}", err=True)


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
