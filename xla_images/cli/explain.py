"""`explain RULE`: what an error's rule means, the doc section that explains it, and an example fix."""
from __future__ import annotations

import click

from .. import rules


@click.command("explain")
@click.argument("rule")
def explain(rule: str) -> None:
    """Explain the RULE an error names (the word in `error [RULE]`), as `ruff rule` or `rustc --explain` do.

    \b
    Every rule is listed in docs/rules.md. An unknown rule exits 2 with the closest ones.
    """
    click.echo(rules.explain(rule), nl=False)
