"""`lock`: resolve each flavour's wheels and write Dockerfiles/<tag>/requirements.lock (run.packages.lock)."""
from __future__ import annotations

import time

import click

from ..errors import Failure
from ..generate.plan import Plan
from ..run.packages import lock as locks
from .common import flavour_filters, plan_options, select


@click.command("lock")
@click.argument("flavours", nargs=-1, metavar="[FLAVOUR]...")
@click.option("--stale-only", is_flag=True, help="Only flavours whose lock is missing or stale.")
@click.option("--jobs", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Resolutions run at the same time (each is one pip process, mostly waiting on the network).")
@flavour_filters
@plan_options
def lock(plan: Plan, flavours: tuple[str, ...], filters: dict[str, str | None], stale_only: bool,
         jobs: int) -> None:
    """Resolve each flavour's wheels (nothing is installed) and write Dockerfiles/<tag>/requirements.lock.

    \b
    The lock pins the whole dependency closure as `name==version --hash=sha256:...`; image builds install it
    with --require-hashes, so every image gets exactly the resolved files. pip resolves for the image's python
    and platform from the flavour's wheel source, ignoring the host's pip settings (no pip config file, no PIP_*
    variables; the index URLs go in pip's environment, never its command line) but using the site's CA bundle. Flavours that differ only by accelerator are resolved together.
    A flavour whose wheel source is an absent wheelhouse is skipped with a warning (an error when named).

    \b
    Examples:
      build.py lock                          # every flavour (a few minutes)
      build.py lock r2.9.0_3.11_cpu
      build.py lock --torch-xla 2.9 --stale-only
    """
    # A devel image is locked by its runtime flavour's lock (it is a stage of the same Dockerfile).
    runtimes = {flavour.tag: flavour for flavour in plan.flavours}
    chosen = list({flavour.runtime_tag: runtimes[flavour.runtime_tag]
                   for flavour in select(plan, flavours, filters)}.values())
    if stale_only:
        chosen = locks.stale(plan, chosen)
        if not chosen:
            click.echo("every selected lock is fresh")
            return
    started = time.monotonic()
    report = locks.lock(plan, chosen, jobs=jobs, progress=click.echo)
    for item in report.skipped:
        click.echo(f"skipped {item.tag}: {item.reason}", err=True)
    for result in report.locked:
        state = "written" if result.changed else "unchanged"
        click.echo(f"{result.path.relative_to(plan.root)}: {result.wheels} wheels, {state}")
    for failure in report.failed:
        click.echo(f"not locked: {', '.join(failure.tags)}\n{failure.error.render()}", err=True)
    locked_tags = {result.path.parent.name for result in report.locked}
    locks.check_layouts(plan, [flavour for flavour in chosen if flavour.tag in locked_tags], progress=click.echo)
    click.echo(f"{len(report.locked)} lock(s) in {time.monotonic() - started:.1f}s, {len(report.skipped)} skipped, "
               f"{len(report.failed)} group(s) failed")
    named = {plan.select((name,))[0].tag for name in flavours}
    unavailable = [item for item in report.skipped if item.tag in named]
    if report.failed or unavailable:
        tags = [tag for failure in report.failed for tag in failure.tags] + [item.tag for item in unavailable]
        hint = unavailable[0].reason if unavailable else report.failed[0].error.hint
        raise Failure(f"could not lock {', '.join(tags)}", rule="lock-resolve", hint=hint)
