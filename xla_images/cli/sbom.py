"""`sbom`: the CycloneDX SBOM of a flavour's image or of any image on the engine."""
from __future__ import annotations

from pathlib import Path

import click

from ..generate.plan import Plan
from ..run.checking import sbom as sboms
from .common import plan_options, say


@click.command("sbom")
@click.argument("name", metavar="IMAGE_OR_FLAVOUR")
@click.option("-o", "--output", "output", type=click.Path(path_type=Path), default=None,
              help="Write the SBOM here (default: print it).")
@plan_options
def sbom(plan: Plan, name: str, output: Path | None) -> None:
    """Write a CycloneDX 1.6 JSON SBOM of an image: its lock, venv distributions and Debian packages.

    \b
    A flavour tag or alias means its local image (`xla-images:<tag>`) and its requirements.lock (sha256 of
    every wheel); any other image reference is read as it is (with the lock of the flavour its
    io.xla-images.tag label names, if the matrix has it). What is installed is read from the image itself:
    the venv's distributions (in a container) and /var/lib/dpkg/status. The BOM is validated against the
    CycloneDX schema before it is written. Locked packages the image lacks are warnings.

    \b
    Examples:
      build.py sbom r2.9.0_3.11_cpu -o sbom.cdx.json
      build.py sbom 127.0.0.1:5000/xla-images@sha256:...
    """
    made, subject = sboms.sbom_command(plan, name, output, say)
    if output is None:
        click.echo(made.to_json(), nl=False)
        return
    say(f"SBOM of {subject.ref}: {len(made.bom.components)} components, written to {output}")
