"""`run-spec TAG`: how to run a flavour's image, as `docker run` arguments or a Kubernetes Job (model.running)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import yaml

from ..errors import ConfigError
from ..generate.plan import Plan
from ..model import running
from ..model.flavour import Accelerator
from ..model.published import read_published
from ..model.registry import Registry
from ..names import PUBLISHED_NAME
from .common import plan_options, published_option, select

FORMATS = ("docker", "kubernetes")
TOPOLOGY = re.compile(r"[1-9][0-9]{0,2}(x[1-9][0-9]{0,2}){1,2}")


@click.command("run-spec")
@click.argument("tag")
@click.option("--format", "output_format", type=click.Choice(FORMATS), default="docker", show_default=True,
              help="`docker run` arguments, or a Kubernetes batch/v1 Job manifest (YAML).")
@click.option("--profile", type=click.Choice([running.Profile.RESTRICTED, running.Profile.TPU]), default=None,
              help="How to run it (default: tpu for tpuvm flavours, restricted for cpu flavours).")
@click.option("--topology", default=None, metavar="AxB[xC]",
              help=f"GKE TPU topology of a tpu Job (default: {running.TpuSlice().topology}).")
@click.option("--tpu-accelerator", default=None, metavar="NAME",
              help=f"GKE TPU accelerator of a tpu Job (default: {running.TpuSlice().accelerator}).")
@click.option("--chips", type=click.IntRange(1, 8), default=None,
              help="google.com/tpu chips the pod requests (default: the topology's chips, at most 4; 8 for a v5e 2x4 host).")
@click.option("--uid", type=click.IntRange(1, 2**31 - 1), default=None,
              help=f"UID of the restricted profile (default: {running.ARBITRARY_UID}, which the image does not know).")
@click.option("--command", "command_text", default=None, metavar="TEXT",
              help="What the container runs (shell words; default: the smoke suite's environment and scan checks).")
@published_option("Where to find the image's digest")
@plan_options
def run_spec(plan: Plan, tag: str, output_format: str, profile: str | None, topology: str | None,
             tpu_accelerator: str | None, chips: int | None, uid: int | None, command_text: str | None,
             published_path: Path | None) -> None:
    """Print how to run TAG's image: what `build.py test` runs it under, for docker or Kubernetes.

    \b
    tpuvm flavours (tpu profile): --privileged, --net host, --shm-size=16G, PJRT_DEVICE=TPU; the Job requests
    google.com/tpu on a GKE TPU node (cloud.google.com/gke-tpu-accelerator and gke-tpu-topology selectors).
    cpu flavours (restricted profile): an arbitrary UID with GID 0, read-only root with a writable /tmp, every
    capability dropped, no-new-privileges, no network; the Job meets the restricted Pod Security Standard.
    The image is named by digest when published.json records the tag (what `push` verified), else by tag in
    the site's registry, and the output says which. docs/running.md explains each setting.

    \b
    Examples:
      build.py run-spec r2.9.0_3.11_cpu
      build.py run-spec r2.9.0_3.11_tpuvm --format kubernetes --topology 2x4 > job.yaml
    """
    flavour = select(plan, (tag,), {})[0]
    slice_ = running.TpuSlice(tpu_accelerator or running.TpuSlice().accelerator,
                              _topology(topology) if topology else running.TpuSlice().topology, chips)
    chosen = profile or (running.Profile.TPU if flavour.accelerator is Accelerator.TPU else running.Profile.RESTRICTED)
    run_profile = (running.tpu_profile() if chosen == running.Profile.TPU
                   else running.restricted_profile(uid or running.ARBITRARY_UID))
    image, how = image_reference(plan, flavour.tag, published_path)
    command = shlex.split(command_text) if command_text else list(running.SMOKE_COMMAND)
    click.echo(f"# {flavour.tag}, {chosen} profile; {how}")
    if output_format == "docker":
        words = ["docker", "run", "--rm", *running.docker_args(run_profile), image, *command]
        click.echo(" ".join(shlex.quote(word) for word in words))
        return
    job = running.kubernetes_job(run_profile, image, name=job_name(flavour.tag), tag=flavour.tag, command=command,
                                 tpu=slice_ if chosen == running.Profile.TPU else None)
    click.echo(yaml.safe_dump(job, sort_keys=False), nl=False)


def image_reference(plan: Plan, tag: str, published_path: Path | None) -> tuple[str, str]:
    """(reference, how it was found): by digest from published.json, else by tag in the site's registry."""
    path = published_path or plan.root / PUBLISHED_NAME
    entry = read_published(path).get(tag)
    if entry is not None:
        return entry.ref, f"image by digest, as {path.name} records it (`build.py resolve` re-verifies it)"
    return (Registry.parse(plan.site.registry, "site registry").ref(tag),
            f"image by tag: {path.name} records no push of {tag} (push it to name it by digest)")


def job_name(tag: str) -> str:
    """A DNS-1123 name from a tag (`r2.9.0_3.11_cpu` -> `xla-r2-9-0-3-11-cpu`)."""
    return ("xla-" + re.sub(r"[^a-z0-9]+", "-", tag.lower())).strip("-")[:63].rstrip("-")


def _topology(text: str) -> str:
    if not TOPOLOGY.fullmatch(text):
        raise ConfigError(f"--topology {text!r} is not AxB or AxBxC", rule="run-spec-topology",
                          hint="for example --topology 2x2 (v5e, 4 chips) or 2x2x1 (v4)")
    return text
