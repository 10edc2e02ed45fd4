"""`base`: bootstrap `xla-images/base:<python>` from Debian packages (run.building.base)."""
from __future__ import annotations

import click

from ..errors import ConfigError
from ..generate.plan import Plan
from ..run.building import base as bases
from .common import plan_options


@click.command("base")
@click.option("--python", "pythons", multiple=True, metavar="X.Y",
              help="Bootstrap a base for this python (repeatable). Default: every python of the matrix that "
                   "Debian can provide.")
@click.option("--suite", type=click.Choice(sorted({recipe.suite for recipe in bases.RECIPES.values()})),
              default=None, help="Debian suite (default: the one whose python3 is the python asked for).")
@click.option("--mirror", metavar="URL", default=None, help="Debian mirror (default: debootstrap's own).")
@click.option("--force", is_flag=True, help="Bootstrap again even if the base image exists.")
@plan_options
def base(plan: Plan, pythons: tuple[str, ...], suite: str | None, mirror: str | None, force: bool) -> None:
    """Bootstrap `xla-images/base:<python>` from Debian packages, for sites that cannot pull a python image.

    \b
    debootstrap --variant=minbase, with pythonX.Y, its venv module, libpythonX.Y (the shared library
    torch_xla's _XLAC links against) and ca-certificates; then imported with the labels
    io.xla-images.base.python / .suite. `build` uses it for a python whose site base cannot be pulled.
    Pythons this can bootstrap: 3.11 (bookworm) and 3.13 (trixie): the suites whose python3 they are.
    Needs root and debootstrap (`ci/engine.sh install`). Takes a minute or two; skipped when the image exists.

    \b
    Examples:
      sudo ./build.py base --python 3.11
      sudo ./build.py base                 # every python of the matrix that Debian provides
    """
    if not pythons:
        # Every image's python (runtime and devel alike); one line for each this machine cannot have.
        buildable, unbuildable = bases.bootstrappable(image.python for image in plan.every_image)
        for python, reason in unbuildable:
            click.echo(f"python {python}: not bootstrapped: {reason}", err=True)
        pythons = tuple(buildable)
        if not pythons:
            raise ConfigError("no python of the matrix can be bootstrapped here", rule="base-python")
    for python in pythons:
        bases.suite_for(python, suite)  # all usage errors before any work
    for python in pythons:
        bases.ensure_base(python, suite=suite, mirror=mirror, force=force, say=click.echo)
