"""`doctor`: check what building, testing and publishing need (run.doctor), as a table or plain lines."""
from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from .. import settings
from ..errors import Failure
from ..generate.plan import Plan
from ..run import doctor as doctoring
from .common import in_ci, plan_options


@click.command("doctor")
@plan_options
def doctor(plan: Plan) -> None:
    """Check what building, testing and publishing need, and say how to fix what is missing.

    \b
    Engine (and its version), registry (site registry's /v2/), a base image per python of the matrix,
    CA bundle, free disk at the engine's root, debootstrap, shellcheck, hadolint, the optional extras of the
    install (e.g. 'plot' for `bench --plot`). Exit 1 when a required item is missing.
    """
    report = doctoring.diagnose(plan, builder=settings.read_builder())
    console = Console()
    if console.is_terminal and not in_ci():
        console.print(_doctor_table(report))
    else:
        for item in report.items:
            click.echo(item.plain())
    missing = report.missing_required()
    if missing:
        raise Failure(f"{len(missing)} required item(s) missing: {', '.join(item.name for item in missing)}",
                      rule="doctor", hint="run the fix command shown for each")
    click.echo("ready" + (" (some optional items missing)" if report.missing_optional() else ""))


def _doctor_table(report: doctoring.Report) -> Table:
    table = Table("", "check", "state", "fix")
    marks = {doctoring.Status.OK: "[green]ok[/]", doctoring.Status.WARN: "[yellow]warn[/]",
             doctoring.Status.MISSING: "[red]missing[/]"}
    for item in report.items:
        table.add_row(marks[item.status], item.name, item.detail, item.fix or "")
    return table
