"""`sign` and `verify`: cosign signatures and SBOM attestations of published digests."""
from __future__ import annotations

from pathlib import Path

import click

from .. import settings
from ..errors import ConfigError, Failure
from ..generate.plan import Plan
from ..names import PUBLISHED_NAME, REPORTS
from ..model import published as model_published
from ..run.shipping import sign as signing
from ..run import registry as registries
from ..run.checking import sbom as sboms
from .common import flavour_filters, plan_options, published_option, reports_option, say, select


def _entries(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None],
             published_path: Path | None) -> list[model_published.Published]:
    """published.json's records of the selected flavours; a selected flavour not published is an error."""
    path = published_path or plan.root / PUBLISHED_NAME
    if not path.is_file():
        raise ConfigError(f"{path} does not exist", rule="sign-published",
                          hint="push first: `build.py push TAGS` records the digests to sign")
    published = model_published.read_published(path)
    chosen = select(plan, names, filters) if names or any(filters.values()) else None
    tags = [flavour.tag for flavour in chosen] if chosen is not None else sorted(published)
    missing = [tag for tag in tags if tag not in published]
    if missing and (names or not published):
        raise Failure(f"not in {path}: {', '.join(missing)}", rule="sign-published",
                      hint="push them first (`build.py push TAGS`); only verified digests are signed")
    entries = [published[tag] for tag in tags if tag in published]
    if not entries:
        raise Failure(f"no selected flavour is in {path}", rule="sign-published", hint="push first")
    return entries


@click.command("sign")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@click.option("--key", "key_text", required=True, metavar="KEY",
              help="cosign private key (cosign.key) or KMS URI; its password comes from COSIGN_PASSWORD.")
@click.option("--sbom/--no-sbom", "with_sbom", default=True, show_default=True,
              help="Also attach the image's SBOM as a signed cyclonedx attestation.")
@reports_option(f"reports/<tag>/{sboms.SBOM_NAME} files")
@published_option()
@flavour_filters
@plan_options
def sign(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], key_text: str, with_sbom: bool,
         reports_dir: Path | None, published_path: Path | None) -> None:
    """Sign the published digests of flavours with cosign, and attach their SBOMs (default: all published).

    \b
    Signs HOST/REPO@sha256:... as published.json records it (never a tag), key-based and offline (no
    transparency log). With --sbom (default) the SBOM is made from the local copy of that very image (same
    digest), written to reports/<tag>/sbom.cdx.json and attached with `cosign attest --type cyclonedx`.
    Signatures and attestations are stored in the registry as sha256-<hex>.sig / .att tags.

    \b
    Examples:
      COSIGN_PASSWORD=... build.py sign r2.9.0_3.11_cpu --key cosign.key
      build.py resolve --python 3.11 --accelerator cpu --verify --key cosign.pub
    """
    key = signing.Key.parse(key_text, private=True, where="--key", password=settings.read_cosign_password())
    entries = _entries(plan, names, filters, published_path)
    named = registries.named_hosts(plan.site.registry)  # the environment's credentials go to no other host
    root = reports_dir or plan.root / REPORTS

    def sbom_for(entry: model_published.Published) -> Path:
        image = signing.pushed_image(entry, named)
        registry, _, digest = entry.ref.partition("@")
        subject = sboms.Subject(name=registry, image_id=str(sboms.local_subject(image).image_id), tag=entry.tag,
                                digest=digest)
        return sboms.write(sboms.image_sbom(plan, sboms.flavour_of(plan, entry.tag), image, subject, say),
                           root / entry.tag / sboms.SBOM_NAME)

    done = signing.sign_published(entries, key, sbom_for=sbom_for if with_sbom else None, say=say, named=named)
    for item in done:
        click.echo(f"{item.tag}\t{item.ref}\tsigned{'' if item.sbom is None else ' + sbom attested'}")


@click.command("verify")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@click.option("--key", "key_text", default=None, metavar="PUB",
              help="cosign public key (default: the site's cosign_public_key).")
@click.option("--sbom/--no-sbom", "with_sbom", default=True, show_default=True,
              help="Also verify the signed SBOM attestation (and that it describes the digest).")
@click.option("--sbom-dir", type=click.Path(path_type=Path), default=None,
              help="Write each verified SBOM to DIR/<tag>.cdx.json.")
@published_option()
@flavour_filters
@plan_options
def verify(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], key_text: str | None,
           with_sbom: bool, sbom_dir: Path | None, published_path: Path | None) -> None:
    """Verify the signatures (and SBOM attestations) of published digests; exit 1 naming each refusal.

    \b
    Examples:
      build.py verify --key cosign.pub
      build.py verify r2.9.0_3.11_cpu --key cosign.pub --sbom-dir sboms/
    """
    chosen = key_text or plan.site.cosign_public_key()
    if not chosen:
        raise ConfigError("no public key", location="--key", rule="sign-key",
                          hint="pass --key cosign.pub, or set cosign_public_key in site.yaml")
    key = signing.Key.parse(chosen, private=False, where="--key" if key_text else "site cosign_public_key")
    entries = _entries(plan, names, filters, published_path)
    verified, refused = signing.verify_published(entries, key, with_sbom=with_sbom, sbom_dir=sbom_dir, say=say,
                                                 named=registries.named_hosts(plan.site.registry))
    for item in verified:
        sbom_text = "" if item.sbom_components is None else f"\tsbom ok ({item.sbom_components} components)"
        click.echo(f"{item.tag}\t{item.ref}\tsignature ok{sbom_text}")
    if refused:
        raise Failure(f"{len(refused)} of {len(entries)} image(s) refused:\n    " + "\n    ".join(refused),
                      rule="signature-verified")
