"""Pull a resolved flavour through a zone's pull-through cache (a pull mirror) instead of from its registry.

A v5p-256 job pulls its image on 64 VMs at once; with a mirror in the zone (distribution's proxy mode:
`ci/registry.sh start-mirror`), the origin registry sends each blob once per zone and the VMs share the copy.

The contract, in order:

1. The caller resolved the flavour against the ORIGIN (tag -> digest, with `--verify` its signature): what to
   pull is decided there and nowhere else. The mirror is never asked for a tag.
2. The engine pulls `MIRROR[/PREFIX]/REPOSITORY@DIGEST`. A digest reference is content-addressed: the engine
   checks the manifest it gets against the digest and every layer against the manifest, so a mirror can be
   slow or absent but cannot hand over another image.
3. The image is tagged with the origin's name, `HOST/REPOSITORY:TAG`, so `docker images` and a `FROM` show the
   name users expect. The engine keeps the mirror's digest reference too (it is how the pull was checked);
   `HOST/REPOSITORY@DIGEST` itself cannot be made locally without asking the origin.

When the mirror cannot serve the digest (down, unknown name, TLS or credentials wrong, it cannot fetch from the
origin) the pull fails with one error under a `mirror-*` rule naming the mirror, and nothing is tagged. There
is deliberately no automatic fallback to the origin: the mirror exists so that 64 hosts do not pull from the
origin at once, and a silent fallback turns a broken zone cache into exactly that stampede (and cross-zone
egress), unnoticed. Retrying without the mirror is one explicit flag away, and the hint says so.

Credentials for the mirror come from the docker config for the mirror's host only (credHelpers, credsStore,
auths): XLA_IMAGES_REGISTRY_USER/_PASSWORD are the origin's and are not offered to a cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...errors import Failure, XlaImagesError
from ...model.registry import Mirror, Registry
from .. import engine, registry as registries

Say = Callable[[str], None]
OPTION = "--mirror"
SITE_SETTING = "site pull_mirror"
# A mirror that does not answer is told quickly: three tries (waits 0.5 s and 1 s), not the origin's five.
PREFLIGHT_RETRY = registries.RetryPolicy(attempts=3, first_wait=0.5, max_wait=2.0)
_UNREACHABLE_RULES = ("registry-reachable", "registry-dns")


@dataclass(frozen=True)
class PulledThrough:
    image_id: str
    mirror_ref: str  # MIRROR/REPOSITORY@DIGEST, what the engine pulled and checked
    local_ref: str  # ORIGIN/REPOSITORY:TAG, the name it now carries


def choose(option_text: str | None, site_setting: str | None) -> Mirror | None:
    """The mirror to use: --mirror beats the site's pull_mirror; neither is no mirror."""
    if option_text is not None:
        return Mirror.parse(option_text, where=OPTION)
    if site_setting:
        return Mirror.parse(site_setting, where=SITE_SETTING)
    return None


def split_ref(origin_ref: str) -> tuple[Registry, str]:
    """`HOST/REPO@sha256:...` -> (the origin registry, the digest)."""
    name, _, digest = origin_ref.rpartition("@")
    if not registries.is_digest(digest):
        raise Failure(f"{origin_ref!r} is not a digest reference HOST/REPO@sha256:...", rule="mirror-ref")
    return Registry.parse(name, where="the resolved reference"), digest


def mirror_ref(origin_ref: str, mirror: Mirror) -> str:
    """What to pull from the mirror for a resolved origin reference: the same repository and digest."""
    origin, digest = split_ref(origin_ref)
    return mirror.registry_for(origin).digest_ref(digest)


def pull_through(origin_ref: str, tag: str, mirror: Mirror, say: Say) -> PulledThrough:
    """Pull `origin_ref` (resolved and verified by the caller) from `mirror`, then tag it `ORIGIN/REPO:TAG`."""
    origin, digest = split_ref(origin_ref)
    cache = mirror.registry_for(origin)
    through = cache.digest_ref(digest)
    client = registries.connect(cache, retry=PREFLIGHT_RETRY, docker_config_only=True)
    credentials = client.credentials
    with registries.redacting(credentials):
        _preflight(client, digest, mirror)
        say(f"pulling {through} (the mirror of {origin.name})")
        auth = credentials.auth_config(mirror.host) if credentials else None
        try:
            image_id = engine.transfer.pull_image(through, auth, say)
        except Failure as error:
            raise _mirror_failure(error, mirror, "mirror-pull", keep_hint=False) from None
    engine.images.tag_image(image_id, origin.name, tag)
    return PulledThrough(image_id, through, origin.ref(tag))


def _preflight(client: registries.RegistryClient, digest: str, mirror: Mirror) -> None:
    """Before the engine: does the mirror answer, and can it serve the digest? (A proxy fetches a manifest it
    lacks from the origin on this very request, so a yes here means the pull has what it needs to start.)"""
    try:
        client.check_reachable()
    except Failure as error:
        if error.rule in _UNREACHABLE_RULES:
            raise _mirror_failure(error, mirror, "mirror-reachable", keep_hint=False) from None
        raise _mirror_failure(error, mirror, error.rule) from None  # TLS or credentials: their own fix
    try:
        served = client.manifest_digest(digest)
    except Failure as error:
        if error.rule not in (*_UNREACHABLE_RULES, "registry-request"):
            raise _mirror_failure(error, mirror, error.rule) from None
        # It answered /v2/ a moment ago: a 5xx now is the proxy failing to fetch the manifest from the origin.
        raise _mirror_failure(error, mirror, "mirror-missing", keep_hint=False) from None
    if served != digest:
        raise Failure(f"pull mirror {mirror.name} has no manifest {digest} in {client.registry.repository} and "
                      "could not fetch it from its origin", rule="mirror-missing", hint=_retry_hint(mirror))


def _mirror_failure(error: XlaImagesError, mirror: Mirror, rule: str, *, keep_hint: bool = True) -> Failure:
    hint = f"{error.hint}; {_retry_hint(mirror)}" if error.hint and keep_hint else _retry_hint(mirror)
    return Failure(f"pull mirror {mirror.name}: {error.message}", rule=rule, hint=hint)


def _retry_hint(mirror: Mirror) -> str:
    return (f"check the mirror ({mirror.host}: `ci/registry.sh status` where it runs, and that it proxies this "
            "registry), or pull from the origin itself: retry without --mirror (`--set pull_mirror=` when the "
            "site sets it)")
