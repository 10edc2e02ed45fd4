"""`wheels fetch`: download the locked wheels into the host wheelhouse (run.packages.wheelhouse)."""
from __future__ import annotations

from pathlib import Path

import click

from ..generate.plan import Plan
from ..run.packages import wheelhouse as wheels_module
from .common import flavour_filters, plan_options, select


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
