"""`ship`: build → test → push many images as one plan (run.pipeline), on this engine or split across several."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .. import settings
from ..errors import Failure
from ..generate.plan import Plan
from ..model.registry import Registry
from ..names import PUBLISHED_NAME, REPORTS
from ..run.building import build as building
from ..run.checking import image_tests
from ..run.pipeline import engines as engine_split, ledger as ledgers, runner, ship as shipping
from .common import flavour_filters, in_ci, interrupts_on_sigterm, plan_options, published_option, reports_option, \
    say, select


@click.command("ship")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@click.option("--registry", "registry_text", metavar="HOST[:PORT]/REPO", default=None,
              help="Where to push (default: the site's registry setting).")
@click.option("--engine", "engine_specs", multiple=True, metavar="CONTEXT|URL",
              help="Split the run across these engines (a docker context name, or a DOCKER_HOST URL such as "
                   "ssh://builder or unix:///run/other.sock; `default`: this environment's). Repeatable; whole "
                   "release+python groups go to one engine.")
@click.option("--window", type=click.IntRange(1, 8), default=2, show_default=True,
              help="Images built and not yet freed at any time (2: the next build overlaps the current test).")
@click.option("--keep-images", is_flag=True, help="Leave each pushed image on the engine (default: freed).")
@click.option("--keep-cache", is_flag=True,
              help="Keep the build cache between release+python groups (default: freed, so the disk stays bounded).")
@click.option("--force", is_flag=True, help="Rebuild and push even what the engine or registry already has.")
@click.option("--checks-only", is_flag=True, help="Test with the image checks only, not the smoke suite.")
@click.option("-k", "keyword", metavar="EXPR", default=None, help="Only image checks matching this pytest -k.")
@click.option("--no-bootstrap", is_flag=True,
              help="Do not bootstrap a missing base this machine could have (its images are then blocked).")
@published_option()
@reports_option("reports/pipeline.json, pipeline.log and reports/<tag>/")
@flavour_filters
@plan_options
def ship(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], registry_text: str | None,
         engine_specs: tuple[str, ...], window: int, keep_images: bool, keep_cache: bool, force: bool,
         checks_only: bool, keyword: str | None, no_bootstrap: bool, published_path: Path | None,
         reports_dir: Path | None) -> None:
    """Build, test and push many images as one plan; exit 1 unless every buildable image was pushed.

    \b
    Ordered so shared layers are built once (release by release, python by python, a cpu/tpuvm pair, each
    runtime image and then its devel image); the next build overlaps the current test; an image is pushed as
    soon as it passed, then freed, with the build cache between release+python groups, so the disk holds at most
    --window images. An image this machine cannot build (no base for its python, no wheels on any source) is
    reported as blocked with the fix and fails nothing. What the registry already holds with the same flavour id
    is skipped: an interrupted run is resumed by running it again. One line per image and phase (elapsed, and
    an estimate of what is left); at the end a table, also reports/pipeline.json.

    \b
    Examples:
      build.py ship --variant all                        # the whole matrix, runtime and devel images
      build.py ship r2.9.0_3.11_cpu r2.9.0_3.11_cpu_devel
      build.py ship --variant all --engine default --engine builder2   # split across two engines
    """
    flavours = select(plan, names, filters)
    registry = Registry.parse(registry_text or plan.site.registry,
                              where="--registry" if registry_text else "site registry")
    published = published_path or plan.root / PUBLISHED_NAME
    reports = reports_dir or plan.root / REPORTS
    if engine_specs:
        child = engine_split.ChildCommand(plan_args=_plan_args(click.get_current_context()),
                                          pass_through=_pass_through(registry.name, window, keep_images, keep_cache,
                                                                     force, checks_only, keyword, no_bootstrap))
        with interrupts_on_sigterm():
            entries = engine_split.run_split(flavours, engine_specs, child, published, reports, say)
    else:
        options = shipping.ShipOptions(
            registry, published, reports,
            build=building.BuildOptions(force=force, reports_dir=reports, builder=settings.read_builder()),
            test=image_tests.ImageTestOptions(checks_only=checks_only, keyword=keyword),
            runner=runner.RunnerOptions(window=window, free_images=not keep_images, free_cache=not keep_cache),
            bootstrap_bases=not no_bootstrap)
        with interrupts_on_sigterm():
            entries = shipping.ship(plan, flavours, options, say).results()
    _print_table(entries)
    click.echo(f"report: {reports / shipping.REPORT_NAME}")
    _exit_status(entries)


def _plan_args(context: click.Context) -> list[str]:
    """The options the plan was loaded with, for each engine's `ship` (one plan, whichever engine builds)."""
    params = context.params
    args = ["--matrix", str(Path(params["matrix_path"]).resolve())]
    if params.get("site_path"):
        args += ["--site", str(Path(params["site_path"]).resolve())]
    for override in params.get("overrides") or ():
        args += ["--set", override]
    return args


def _pass_through(registry: str, window: int, keep_images: bool, keep_cache: bool, force: bool, checks_only: bool,
                  keyword: str | None, no_bootstrap: bool) -> list[str]:
    args = ["--registry", registry, "--window", str(window)]
    flags = {"--keep-images": keep_images, "--keep-cache": keep_cache, "--force": force,
             "--checks-only": checks_only, "--no-bootstrap": no_bootstrap}
    args += [flag for flag, on in flags.items() if on]
    return args + (["-k", keyword] if keyword else [])


def _print_table(entries: list[ledgers.Entry]) -> None:
    rows = ledgers.table_rows(entries)
    if in_ci() or not Console(stderr=True).is_terminal:
        for row in rows:
            click.echo("  ".join(f"{cell:<8}" if index else f"{cell:<28}" for index, cell in enumerate(row[:-1]))
                       + f"  {row[-1]}")
        return
    table = Table(*ledgers.TABLE_HEADER)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _exit_status(entries: list[ledgers.Entry]) -> None:
    counts = {result: sum(1 for entry in entries if entry.result is result) for result in ledgers.Result}
    summary = ", ".join(f"{count} {result.value}" for result, count in counts.items() if count)
    say(f"ship: {summary}")
    bad = [entry.flavour.tag for entry in entries
           if entry.result in (ledgers.Result.FAILED, ledgers.Result.INTERRUPTED, ledgers.Result.PENDING)]
    if bad:
        raise Failure(f"{len(bad)} buildable image(s) not pushed: {', '.join(bad)}", rule="ship",
                      hint="each failure's line above names its phase and log; run the same command again to "
                           "resume (what the registry holds is skipped)")
