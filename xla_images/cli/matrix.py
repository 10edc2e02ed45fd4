"""`list` and `validate`: look at the matrix."""
from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from ..generate.plan import Plan
from ..model import lockfile
from .common import flavour_filters, plan_options


@click.command("list")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON array, one object per flavour (a stable contract for CI and scripts).")
@flavour_filters
@plan_options
def list_flavours(plan: Plan, filters: dict[str, str | None], as_json: bool) -> None:
    """List the flavours the matrix declares, with their tags, versions and ABI.

    \b
    Examples:
      build.py list --abi cxx11 --python 3.11
      build.py list --torch-xla 2.9 --json | jq -r '.[].tag'
    """
    flavours = plan.select((), **filters)
    # Whether the committed lock is fresh: a flavour without one cannot be built, and CI skips it with a warning.
    locks = {flavour.tag: lockfile.lock_status(plan, flavour).state.value for flavour in flavours}
    if as_json:
        click.echo(json.dumps([{**flavour.to_json(), "lock": locks[flavour.tag]} for flavour in flavours], indent=2))
        return
    table = Table("tag", "aliases", "torch_xla", "torch", "python", "abi", "accel", "libtpu", "lock", "id")
    for flavour in flavours:
        table.add_row(flavour.tag, " ".join(flavour.aliases), flavour.torch_xla, flavour.torch, flavour.python,
                      flavour.abi.value, flavour.accelerator.value, flavour.libtpu or "-", locks[flavour.tag],
                      flavour.id[7:19])
    Console(width=200).print(table)
    click.echo(f"{len(flavours)} flavour(s)")


@click.command("validate")
@plan_options
def validate(plan: Plan) -> None:
    """Check matrix.yaml and the site settings; print every error with file, line, rule and fix.

    Exit code 0 when valid, 2 when not. Every other command validates first too.
    """
    click.echo(f"{plan.matrix_path}: valid, {len(plan.flavours)} flavour(s)")
