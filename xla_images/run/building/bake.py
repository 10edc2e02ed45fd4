"""`ci bake --contexts`: the build contexts docker buildx bake builds from, and the site's override file.

generate.cigen writes the committed docker-bake.json; this module fills the contexts directory it names with
what `build` would hand the engine, so bake and `build` make the same layers.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ... import diskio
from ...errors import ConfigError, Failure
from ...generate import cigen
from ...generate.plan import Plan
from ...model.target import Target
from . import build, context
from ..packages import lock as locks
from .context import secrets_dir_for


def assemble_bake_contexts(plan: Plan, flavours: list[Target], contexts: Path,
                           choose_base: Callable[[Target], str] | None = None) -> Path:
    """Write each flavour's build context to `contexts/<tag>/` and the override file; return its path.

    The contexts are exactly what `build` gives the engine (context.write_context), so bake builds the same image
    from the same lock, wheels and smoke suite. The base is chosen as `build` chooses it (site base if here or
    pullable, else the bootstrapped one): a bootstrapped base exists only on this engine, so a remote builder
    needs a site base it can pull (site.yaml `bases`).
    """
    chooser = choose_base or (lambda flavour: build.choose_base(flavour.python, flavour.base_image))
    unlocked = []
    for flavour in flavours:
        try:
            locks.require_fresh(plan, flavour)
        except Failure as error:
            unlocked.append(error.message)
    if unlocked:
        raise Failure("cannot assemble contexts without fresh locks:\n  " + "\n  ".join(unlocked),
                      rule="lock-fresh", hint="run `./build.py lock TAG...`, or choose flavours with "
                                              "--abi/--python/--torch-xla/--accelerator")
    contexts = contexts.resolve()
    contexts.mkdir(parents=True, exist_ok=True)
    base_images = {}
    for flavour in flavours:
        base_images[flavour.tag] = chooser(flavour)
        _replace_context(plan, flavour, contexts / flavour.tag, context.write_context)
    secrets = {flavour.tag: context.context_secrets(contexts / flavour.tag) for flavour in flavours}
    override = contexts / cigen.OVERRIDE_NAME
    diskio.write_text_atomic(override, cigen.bake_override(plan, flavours, contexts, base_images, secrets),
                             "the bake override", shared=True)
    return override


def _replace_context(plan: Plan, flavour: Target, target: Path,
                     write_context: Callable[[Plan, Target, Path], list[str]]) -> None:
    """Assemble next to `target`, then swap: an interrupted run never leaves half a context under its name."""
    if target.exists() and not (target / "Dockerfile").is_file():
        raise ConfigError(f"{target} exists and is not a build context", rule="bake-contexts",
                          hint="point --contexts at a directory of its own, e.g. build/bake")
    scratch = Path(tempfile.mkdtemp(prefix=f".{flavour.tag}-", dir=target.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; a builder running as another user must read it
    try:
        write_context(plan, flavour, scratch)
        for old in (target, secrets_dir_for(target)):
            if old.exists():
                shutil.rmtree(old)
        if secrets_dir_for(scratch).exists():
            secrets_dir_for(scratch).rename(secrets_dir_for(target))
        scratch.rename(target)
    finally:
        for leftover in (scratch, secrets_dir_for(scratch)):
            if leftover.exists():
                shutil.rmtree(leftover)
