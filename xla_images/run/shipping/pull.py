"""`pull`: an image resolved like `resolve`, pulled by digest from its registry or through a zone's mirror."""
from __future__ import annotations

from typing import Callable

from ...model.registry import Mirror
from .. import engine, registry as registries
from . import mirror as mirroring, resolve as resolving


def pull(resolved: resolving.Resolved, mirror: Mirror | None, named: tuple[str, ...],
         say: Callable[[str], None]) -> str:
    """Pull `resolved` by digest; the name the image now has locally (the ref, or HOST/REPO:TAG through a mirror).

    Through a mirror: verified against the registry, pulled from the mirror, tagged with the registry's name
    (run.shipping.mirror). Else with the credentials the environment has for the registry, never printed."""
    if mirror is not None:
        pulled = mirroring.pull_through(resolved.ref, resolved.tag, mirror, say)
        say(f"pulled {pulled.mirror_ref} as image {pulled.image_id}, tagged {pulled.local_ref} ({resolved.ref})")
        return pulled.local_ref
    registry = resolving.registry_of(resolved.ref)
    credentials = registries.load_credentials(registry.host, named=named)
    with registries.redacting(credentials):
        auth = credentials.auth_config(registry.host) if credentials else None
        image_id = engine.transfer.pull_image(resolved.ref, auth, say)
    say(f"pulled {resolved.ref} as image {image_id}")
    return resolved.ref
