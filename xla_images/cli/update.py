"""`update`: add the torch_xla releases the package index has and the matrix lacks."""
from __future__ import annotations

import click

from ..errors import ConfigError, Failure
from ..generate import sync
from ..generate.plan import Plan, plan_for_site
from ..run.packages import upstream
from .common import plan_options


@click.command("update")
@click.option("--release", "releases", multiple=True, metavar="X.Y.Z",
              help="Add this torch_xla release (repeatable). Default: every release newer than the matrix's newest.")
@click.option("--allow", "allow", multiple=True, metavar="X.Y.Z",
              help="Take this release although it skips more than a minor release after the matrix's newest "
                   "(2.9.0 -> 2.11.0); without it such a release is left out with a warning (repeatable).")
@click.option("--write", is_flag=True, help="Apply the change to matrix.yaml and matrix.wheels.json, then render.")
@click.option("--check", "check_only", is_flag=True,
              help="Write nothing; exit 1 when the index has a release the matrix lacks (for a scheduled job).")
@plan_options
def update(plan: Plan, releases: tuple[str, ...], allow: tuple[str, ...], write: bool, check_only: bool) -> None:
    """Read new torch_xla releases from the package index and add them to matrix.yaml; print the diff.

    \b
    For each release this works out, from the index alone (simple API + the wheel's METADATA, read with
    HTTP range requests): the torch pin, the libtpu pin (the `tpu` extra), the pythons torch_xla and torch
    both have wheels for (python_support), the git tags, an exclude for each python its libtpu has no
    wheel for, and the torchvision and torchaudio whose METADATA pins that torch (also added to a release
    the matrix has without them). Comments and order of matrix.yaml are kept; nothing is written unless the
    result validates.
    The wheel facts of every pin go to matrix.wheels.json, which `validate` checks offline (rule wheel-python).
    Yanked files (PEP 592) are skipped; a release that skips more than a minor release is left out with a
    warning unless --allow names it.

    \b
    Examples:
      build.py update                       # print what would change
      build.py update --write && build.py lock --stale-only
      build.py update --release 2.9.0 --write
      build.py update --check               # exit 1 when upstream is ahead
    """
    if write and check_only:
        raise ConfigError("--write and --check exclude each other", rule="update-options",
                          hint="--check for a scheduled job, --write to apply")
    result = upstream.plan_update(plan.matrix_path, plan.site, releases, allow=allow,
                                  progress=lambda line: click.echo(line, err=True))
    _say_facts(result)
    if result.diff:
        click.echo(result.diff, nl=False)
    if result.cache_after != result.cache_before:
        click.echo(f"{result.cache_path.name}: wheel facts {'updated' if write else 'would be updated'}")
    if check_only:
        if result.missing:
            lacks = [f"torch_xla {', '.join(result.added)}"] if result.added else []
            lacks += [f"the companions of torch_xla {', '.join(version for version, _ in result.filled)}"
                      ] if result.filled else []
            raise Failure(f"the index has {' and '.join(lacks)}, which the matrix lacks",
                          rule="update-behind", hint="run `./build.py update --write`, then `./build.py lock "
                                                     "--stale-only`, and commit the result")
        click.echo(f"up to date with {result.index_url}")
        return
    if not write:
        click.echo("added: " + ", ".join(result.added) if result.added else "the matrix has every release"
                   + ("" if not result.filled else "; companions would be added (--write)"))
        return
    written = upstream.write_update(result)
    for path in written:
        click.echo(f"wrote {path}")
    rendered = sync.write(plan_for_site(plan.matrix_path, plan.site))
    click.echo(f"rendered: {len(rendered.written)} written, {len(rendered.removed)} removed; "
               "now run `./build.py lock --stale-only`")


def _say_facts(result: upstream.UpdateResult) -> None:
    """The warnings, then what was read for each release added and each release whose companions were."""
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    for facts in result.facts:
        commits = ", ".join(f"{name} {commit[:12]}" for name, commit in (("torch_xla", facts.xla_commit),
                                                                         ("torch", facts.torch_commit)) if commit)
        companions = "".join(f", {name} {version}" for name, version in facts.companions.items())
        click.echo(f"torch_xla {facts.torch_xla}: torch {facts.torch}, libtpu {facts.libtpu or '-'}{companions}"
                   + (f"; the wheel was built from {commits}" if commits else ""))
        for note in facts.notes:
            click.echo(f"  note: {note}")
    for version, settings in result.filled:
        click.echo(f"torch_xla {version}: companions " + ", ".join(f"{key} {value.strip(chr(34))}"
                                                                    for key, value in settings))
