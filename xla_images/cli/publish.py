"""`push`, `resolve`, `pull`: ship images to a registry and find them again by digest."""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

import click

from ..errors import ConfigError
from ..generate.plan import Plan
from ..model.registry import Mirror, Registry
from ..names import PUBLISHED_NAME
from ..run import registry as registries
from ..run.shipping import mirror as mirroring, publish, pull as pulling, resolve as resolving, sign as signing
from .common import flavour_filters, plan_options, published_option, say, select


def _registry_option(help_text: str) -> Callable[..., Any]:
    return click.option("--registry", "registry_text", metavar="HOST[:PORT]/REPO", default=None, help=help_text)


@click.command("push")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@_registry_option("Where to push (default: the site's registry setting).")
@published_option()
@flavour_filters
@plan_options
def push(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], registry_text: str | None,
         published_path: Path | None) -> None:
    """Push built flavour images (tag, then aliases) and verify each against the registry's API.

    \b
    The canonical tag is pushed and verified first; aliases follow only then, so no alias ever names a
    manifest the registry lacks. Verified flavours are merged into published.json as they complete.
    Credentials as docker finds them: XLA_IMAGES_REGISTRY_USER/_PASSWORD (for XLA_IMAGES_REGISTRY's host, else
    the registry pushed to), else the docker config's credHelpers, credsStore or auths (never printed). TLS:
    the system store plus /etc/docker/certs.d.

    \b
    Examples:
      build.py push r2.9.0_3.11_cpu --registry 127.0.0.1:5000/xla-images
      build.py push --abi cxx11 --python 3.11
    """
    flavours = select(plan, names, filters)
    registry = Registry.parse(registry_text or plan.site.registry,
                                      where="--registry" if registry_text else "site registry")
    path = published_path or plan.root / PUBLISHED_NAME
    done = publish.push_all(flavours, registry, path, progress=say, compression=plan.site.compression)
    for entry in done:
        click.echo(f"{entry.tag}\t{entry.ref}\t{' '.join(entry.tags[1:])}")
    say(f"{len(done)} flavour(s) pushed and verified; recorded in {path}")


def _resolve_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @_registry_option("Resolve from this registry's tags instead of published.json.")
    @published_option()
    @click.option("--verify", is_flag=True,
                  help="Refuse the image unless a cosign signature by --key covers its exact digest.")
    @click.option("--key", "key_text", metavar="PUB", default=None,
                  help="Public key for --verify, which it implies (default: the site's cosign_public_key).")
    @click.option("--mirror", "mirror_text", metavar="HOST[:PORT][/PREFIX]", default=None,
                  help="Pull through this pull-through cache, by digest, after resolving against the registry "
                       "(default: the site's pull_mirror; `--set pull_mirror=` for none).")
    @flavour_filters
    @plan_options
    @functools.wraps(command)
    def wrapper(*args: Any, plan: Plan, filters: dict[str, str | None], registry_text: str | None,
                published_path: Path | None, verify: bool, key_text: str | None, mirror_text: str | None,
                **kwargs: Any) -> Any:
        mirror = mirroring.choose(mirror_text, plan.site.pull_mirror)  # a bad value fails before any request
        # The registries this command names: the environment's credentials go to no other (unless
        # XLA_IMAGES_REGISTRY names one), whatever host published.json records.
        named = registries.named_hosts(plan.site.registry, registry_text)
        resolved = _resolve(plan, filters, registry_text, published_path, named)
        if verify or key_text:
            # Before anything is printed or pulled: an unverified ref must never reach a build. The signature is
            # checked at the registry the digest was resolved from, never at a mirror.
            signing.verify_ref(resolved.ref, key_text, plan.site.cosign_public_key(), say, named=named)
        return command(*args, resolved=resolved, mirror=mirror, named=named, **kwargs)

    return wrapper


def _resolve(plan: Plan, filters: dict[str, str | None], registry_text: str | None,
             published_path: Path | None, named: tuple[str, ...]) -> resolving.Resolved:
    if registry_text and published_path:
        raise ConfigError("--published and --registry exclude each other", rule="resolve-source",
                          hint="published.json already names its registry; pass one of them")
    default_published = plan.root / PUBLISHED_NAME
    # Anything at the default place (a fifo, a directory, a dangling link too) is published.json: read_published
    # refuses what is not a readable file, rather than the tags being used without a word.
    if published_path is None and registry_text is None and os.path.lexists(default_published):
        published_path = default_published
    if published_path is not None:
        if not os.path.lexists(published_path):  # anything else that is not a readable file: read_published says
            raise ConfigError("file not found", location=str(published_path), rule="resolve-source",
                              hint="push first, or resolve from a registry with --registry HOST[:PORT]/REPO")
        return resolving.resolve_published(published_path, filters,
                                           functools.partial(registries.connect, named=named), say)
    registry = Registry.parse(registry_text or plan.site.registry,
                                      where="--registry" if registry_text else "site registry")
    return resolving.resolve_registry(list(plan.flavours), registries.connect(registry, named=named), filters)


@click.command("resolve")
@_resolve_options
def resolve(resolved: resolving.Resolved, mirror: Mirror | None, named: tuple[str, ...]) -> None:
    """Print the one `HOST/REPO@sha256:...` that matches the filters.

    \b
    From published.json (re-verified against the registry when it answers), or from a registry's tags.
    None or several matches is an error listing the candidates and the filter that tells them apart.
    With a mirror (--mirror or the site's pull_mirror) the digest is still resolved against the registry, and
    the same repository and digest at the mirror is printed: `MIRROR[/PREFIX]/REPO@sha256:...`. The mirror is
    not asked (the host that pulls may reach it where this one does not); the engine checks the digest.

    \b
    Examples:
      build.py resolve --abi cxx11 --python 3.11 --torch-xla 2.9 --accelerator cpu
      docker pull "$(build.py resolve --abi cxx11 --python 3.11 --accelerator cpu)"
      docker pull "$(build.py resolve --mirror mirror.zone.internal:5000 --python 3.11 --accelerator tpu)"
    """
    if mirror is None:
        click.echo(resolved.ref)
        return
    say(f"resolved {resolved.ref}; through the mirror {mirror}:")
    click.echo(mirroring.mirror_ref(resolved.ref, mirror))


@click.command("pull")
@_resolve_options
def pull(resolved: resolving.Resolved, mirror: Mirror | None, named: tuple[str, ...]) -> None:
    """Resolve like `resolve`, then pull that image by digest; prints the ref (the image id goes to stderr).

    \b
    With a mirror (--mirror or the site's pull_mirror): resolved and verified against the registry, pulled
    from the mirror by digest, then tagged with the registry's name; prints that local name HOST/REPO:TAG.
    A mirror that cannot serve the digest is an error (rule mirror-*), never a silent pull from the registry.
    """
    click.echo(pulling.pull(resolved, mirror, named, say))


@click.group("published")
def published() -> None:
    """Work on published.json, the record of verified pushes that `push` writes and `resolve` reads."""


@published.command("merge")
@click.argument("parts", nargs=-1, type=click.Path(path_type=Path), metavar="PART...")
@click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), default=Path(PUBLISHED_NAME),
              show_default=True, help="Where to write the merged published.json (replaced atomically).")
def merge(parts: tuple[Path, ...], output_path: Path) -> None:
    """Merge published.json parts (one per CI build job) into one published.json; prints `tag: ref` per flavour.

    \b
    Every part is checked like `resolve` reads published.json; the same tag in two parts must name the same
    registry@digest. Nothing is written unless every part is good.

    \b
    Example (the build workflow's publish job):
      build.py published merge parts/published-*/published.json -o published.json
    """
    merged = publish.merge_published_parts(list(parts))
    publish.write_published(output_path, merged)
    for tag in sorted(merged):
        click.echo(f"{tag}: {merged[tag].ref}")
    say(f"{len(merged)} flavour(s) from {len(parts)} part(s) merged into {output_path}")
