"""`ci github` and `ci bake`: write the CI that fans builds out, from the same matrix."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import Failure
from ..generate import cigen, sync
from ..generate.plan import Plan
from ..run.building import bake as baking
from .common import flavour_filters, plan_options, select


@click.group("ci")
def ci() -> None:
    """Generate CI that builds the matrix elsewhere: GitHub Actions workflows, a docker buildx bake file.

    \b
    The files are committed; `build.py render --check` reports them missing or stale like the Dockerfiles.
    """


@ci.command("github")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when a workflow file is missing or stale.")
@plan_options
def github(plan: Plan, check: bool) -> None:
    """Write ci/github/: the matrix build workflow, a reusable resolve workflow and a downstream example.

    \b
    Install the first two into .github/workflows/ of the xla-images repository:
      cp ci/github/xla-images-build.yml ci/github/xla-images-resolve.yml .github/workflows/
    """
    _write_or_check(plan, cigen.github_files(plan), check)


@ci.command("bake")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when docker-bake.json is missing or stale.")
@click.option("--contexts", "contexts", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help=f"Also assemble each flavour's build context under DIR/<tag>/ and write "
                   f"DIR/{cigen.OVERRIDE_NAME} (site registry, base images, flavour ids). "
                   f"Conventional DIR: {cigen.DEFAULT_CONTEXTS}.")
@flavour_filters
@plan_options
def bake(plan: Plan, check: bool, contexts: Path | None, filters: dict[str, str | None]) -> None:
    """Write docker-bake.json: one target per flavour, groups per release, ABI and accelerator.

    \b
    Then, on BuildKit (local or a remote builder):
      build.py ci bake --contexts build/bake
      docker buildx bake -f docker-bake.json -f build/bake/docker-bake.override.json r2.9 --push
    The flavour filters limit which contexts --contexts assembles; docker-bake.json always has every flavour.
    """
    _write_or_check(plan, cigen.bake_files(plan), check)
    if contexts is not None and not check:
        chosen = select(plan, (), filters)
        override = baking.assemble_bake_contexts(plan, chosen, contexts)
        click.echo(f"wrote {len(chosen)} build context(s) under {contexts} and {override}")
        click.echo(f"build with: docker buildx bake -f {cigen.BAKE_FILE} -f {override} "
                   f"{cigen.bake_group_name('r' + chosen[0].release_minor)} --push")


def _write_or_check(plan: Plan, files: dict[Path, str], check: bool) -> None:
    if check:
        problems = [f"{finding.path}: {finding.kind}" for finding in sync.drift(plan.root, files)]
        if problems:
            raise Failure("generated CI files differ from what the matrix renders:\n  " + "\n  ".join(problems),
                          rule="ci-drift", hint="regenerate them with `build.py ci github` / `build.py ci bake`")
        click.echo(f"{len(files)} CI file(s) up to date")
        return
    written = sync.write_files(plan.root, files)
    for relative in files:
        click.echo(f"{'wrote' if relative in written else 'unchanged'} {relative.as_posix()}")
