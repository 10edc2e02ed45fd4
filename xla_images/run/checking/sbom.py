"""A CycloneDX SBOM per image: what the lock promised and what the image really holds.

Two sources, merged per package:
* the flavour's requirements.lock: every wheel's name, version and sha256 (what pip installed, hash-checked);
* the image itself: the distributions installed in its venv (listed by the venv's own python, in a container)
  and the Debian packages of its dpkg status file (copied out of a never-started container).

A pypi component carries the lock's hash when the installed version is the locked one; packages only one
side has are kept and marked (`xla-images:source` = lock | image | lock+image), and a locked package the
image lacks, or holds in another version, is a `mismatch` the caller reports. The BOM's metadata component
is the image: its manifest digest and repository once pushed, its image id before.

The module speaks to the engine only through xla_images.run.engine; assembly (`assemble`) is pure and unit-tested.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from ... import diskio
from ...errors import ConfigError, Failure
from ...generate.plan import Plan
from ...model import lockfile
from ...model.lockfile import Lock
from ...model.target import Target
from ...names import CONSTRAINTS_NAME, DISTRIBUTION, IMAGE_CONSTRAINTS, TAG_LABEL, VENV, local_ref
from .. import engine

SBOM_NAME = "sbom.cdx.json"
SCHEMA = SchemaVersion.V1_6
DPKG_STATUS = "/var/lib/dpkg/status"
OS_RELEASE = "/etc/os-release"
PROPERTY = "xla-images:"
TOOL_NAME = DISTRIBUTION
# Printed before the JSON so interpreter warnings on the same stream cannot be mistaken for the listing.
_MARK = "XLA_IMAGES_SBOM_DISTS "
_LIST_DISTS = (
    "import importlib.metadata as m, json\n"
    "print(" + repr(_MARK) + " + json.dumps(sorted({(d.metadata['Name'], d.version) for d in m.distributions()"
    " if d.metadata['Name']})))\n")


# --- what the image holds ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str
    source: str | None = None


@dataclass(frozen=True)
class Inventory:
    """What is really in an image."""

    python_dists: tuple[tuple[str, str], ...]  # (name, version) as the venv's metadata spells them
    debs: tuple[DebPackage, ...]
    os_release: dict[str, str] = field(default_factory=dict)
    venv: bool = True  # False: the image has no VENV/bin/python, so no python_dists
    dpkg: bool = True  # False: the image has no dpkg status file, so no debs


@dataclass(frozen=True)
class Subject:
    """The image the BOM describes. `digest` is the registry's manifest digest, None for a local image."""

    name: str  # repository, e.g. 127.0.0.1:5000/xla-images, or xla-images locally
    image_id: str
    tag: str | None = None
    digest: str | None = None

    @property
    def ref(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag}" if self.tag else self.image_id

    def purl(self) -> PackageURL | None:
        """pkg:oci needs a manifest digest; a local image has only its config digest (the image id)."""
        if not self.digest:
            return None
        qualifiers = {"repository_url": self.name}
        if self.tag:
            qualifiers["tag"] = self.tag
        return PackageURL(type="oci", name=self.name.rsplit("/", 1)[-1], version=self.digest,
                          qualifiers=qualifiers)


def parse_dpkg_status(text: str) -> list[DebPackage]:
    """Installed packages of a dpkg status file (RFC 822 paragraphs; only `Status: ... installed`)."""
    packages = []
    for paragraph in text.split("\n\n"):
        fields = _paragraph_fields(paragraph)
        if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
            continue
        source = fields.get("Source", "").split(" ")[0] or None
        packages.append(DebPackage(fields["Package"], fields.get("Version", ""),
                                   fields.get("Architecture", ""), source))
    return sorted(packages, key=lambda package: (package.name, package.architecture))


def _paragraph_fields(paragraph: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in paragraph.splitlines():
        if not line or line[0] in " \t":
            continue  # a continuation line (descriptions, conffiles): not a field we read
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def parse_os_release(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            values[key.strip()] = value.strip().strip('"')
    return values


def parse_dist_listing(output: str) -> list[tuple[str, str]]:
    for line in output.splitlines():
        if line.startswith(_MARK):
            return [(str(name), str(version)) for name, version in json.loads(line[len(_MARK):])]
    raise Failure("the venv's python printed no distribution listing", rule="sbom-inventory",
                  hint=f"run `{VENV}/bin/python -c 'import importlib.metadata'` in the image to see why")


def read_inventory(image: str) -> Inventory:
    """The image's venv distributions (run in a container) and dpkg packages (copied, never run)."""
    debs, os_release, dpkg = _read_debian(image)
    python = f"{VENV}/bin/python"
    try:
        run = engine.containers.run_container(image, [python, "-c", _LIST_DISTS], role="sbom", timeout=300)
    except Failure as error:
        # The engine refuses to start a command that does not exist: an image without our venv.
        if error.rule == "engine-run" and _missing_executable(error.message):
            return Inventory((), debs, os_release, venv=False, dpkg=dpkg)
        raise
    if run.exit_code != 0:
        if _missing_executable(run.output):
            return Inventory((), debs, os_release, venv=False, dpkg=dpkg)
        raise Failure(f"listing the venv's distributions in {image} failed (exit {run.exit_code}): "
                      f"{run.output.strip()[-300:]}", rule="sbom-inventory")
    return Inventory(tuple(parse_dist_listing(run.output)), debs, os_release, venv=True, dpkg=dpkg)


def _read_debian(image: str) -> tuple[tuple[DebPackage, ...], dict[str, str], bool]:
    with tempfile.TemporaryDirectory(prefix="xla-images-sbom-") as scratch:
        status = _copy_text(image, DPKG_STATUS, Path(scratch))
        release = _copy_text(image, OS_RELEASE, Path(scratch))
    debs = tuple(parse_dpkg_status(status)) if status is not None else ()
    return debs, parse_os_release(release or ""), status is not None


def _copy_text(image: str, path: str, scratch: Path) -> str | None:
    try:
        copied = engine.containers.extract_from_image(image, path, scratch)
    except Failure as error:
        if error.rule == "image-path-exists":
            return None
        raise
    return copied.read_text(encoding="utf-8", errors="replace")


def _missing_executable(output: str) -> bool:
    # The engine's own start error (it reports it through the run), or the shell's.
    text = output.lower()
    return "no such file or directory" in text or "executable file not found" in text


# --- assembling the BOM -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sbom:
    bom: Bom
    mismatches: tuple[str, ...]  # locked packages the image lacks or holds in another version
    notes: tuple[str, ...]  # what could not be read (no venv, no dpkg status)

    def to_json(self) -> str:
        return JsonV1Dot6(self.bom).output_as_string(indent=2) + "\n"


def assemble(subject: Subject, lock: Lock | None, inventory: Inventory, *, flavour_tag: str | None = None,
             tool_version: str = "0", constraints: str | None = None) -> Sbom:
    """The BOM of `subject`: pypi components from the lock and the venv, deb components from dpkg. constraints:
    the text of the flavour's constraints file, recorded on the subject as its image path and sha256 (the
    components are packages, not files: the file is named where the image's labels name it)."""
    bom = Bom()
    root = _subject_component(subject, flavour_tag, lock, constraints)
    bom.metadata.component = root
    bom.metadata.tools.components.add(Component(type=ComponentType.APPLICATION, name=TOOL_NAME,
                                                version=tool_version))
    pypi, mismatches = _pypi_components(lock, inventory)
    debs = [_deb_component(package, inventory.os_release) for package in inventory.debs]
    for component in pypi + debs:
        bom.components.add(component)
    bom.register_dependency(root, pypi + debs)
    notes = []
    if not inventory.venv:
        notes.append(f"no {VENV}/bin/python in the image: installed python distributions are not listed")
    if not inventory.dpkg:
        notes.append(f"no {DPKG_STATUS} in the image: Debian packages are not listed")
    return Sbom(bom, tuple(mismatches), tuple(notes))


def _subject_component(subject: Subject, flavour_tag: str | None, lock: Lock | None,
                       constraints: str | None = None) -> Component:
    properties = [Property(name=f"{PROPERTY}image-id", value=subject.image_id)]
    if flavour_tag:
        properties.append(Property(name=f"{PROPERTY}flavour", value=flavour_tag))
    if lock is not None:
        properties.append(Property(name=f"{PROPERTY}lock-inputs", value=lock.inputs))
    if constraints is not None:
        properties.append(Property(name=f"{PROPERTY}constraints",
                                   value=f"{IMAGE_CONSTRAINTS} {lockfile.constraints_digest(constraints)}"))
    purl = subject.purl()
    return Component(type=ComponentType.CONTAINER, name=subject.name, version=subject.digest or subject.image_id,
                     purl=purl, bom_ref=str(purl) if purl else subject.ref, properties=properties)


def _pypi_components(lock: Lock | None, inventory: Inventory) -> tuple[list[Component], list[str]]:
    locked = {canonicalize_name(entry.name): entry for entry in (lock.entries if lock else ())}
    installed = {canonicalize_name(name): (name, version) for name, version in inventory.python_dists}
    components, mismatches = [], []
    for key in sorted(set(locked) | set(installed)):
        entry, found = locked.get(key), installed.get(key)
        if entry is not None and inventory.venv:
            if found is None:
                mismatches.append(f"{entry.name}=={entry.version} is locked but not installed in the image")
            elif found[1] != entry.version:
                mismatches.append(f"{entry.name} is locked at {entry.version} but the image has {found[1]}")
        name = found[0] if found else entry.name  # type: ignore[union-attr]
        version = found[1] if found else entry.version  # type: ignore[union-attr]
        source = "+".join(part for part, present in (("lock", entry), ("image", found)) if present)
        properties = [Property(name=f"{PROPERTY}source", value=source)]
        hashes = []
        if entry is not None and entry.version == version:
            hashes.append(HashType(alg=HashAlgorithm.SHA_256, content=entry.sha256))
            properties.append(Property(name=f"{PROPERTY}wheel", value=entry.filename))
        purl = PackageURL(type="pypi", name=str(key), version=version)
        components.append(Component(type=ComponentType.LIBRARY, name=name, version=version, purl=purl,
                                    bom_ref=str(purl), hashes=hashes, properties=properties))
    return components, mismatches


def _deb_component(package: DebPackage, os_release: dict[str, str]) -> Component:
    qualifiers = {}
    if package.architecture:
        qualifiers["arch"] = package.architecture
    if os_release.get("VERSION_CODENAME"):
        qualifiers["distro"] = os_release["VERSION_CODENAME"]
    purl = PackageURL(type="deb", namespace=os_release.get("ID") or "debian", name=package.name,
                      version=package.version, qualifiers=qualifiers)
    properties = [Property(name=f"{PROPERTY}source", value="dpkg")]
    if package.source:
        properties.append(Property(name=f"{PROPERTY}deb-source", value=package.source))
    return Component(type=ComponentType.LIBRARY if package.name.startswith("lib") else ComponentType.APPLICATION,
                     name=package.name, version=package.version, purl=purl, bom_ref=str(purl),
                     properties=properties)


# --- validation and files -------------------------------------------------------------------------------------

def validate(text: str, where: str = SBOM_NAME) -> None:
    """Check a BOM against the CycloneDX 1.6 JSON schema (strict); a Failure names the first error."""
    # Imported here: the validator's format checkers take seconds to load, which every CLI call would pay.
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SCHEMA).validate_str(text)
    if error is not None:
        raise Failure(f"{where} is not a valid CycloneDX {SCHEMA.to_version()} document: {str(error)[:300]}",
                      rule="sbom-valid")


def generate(image: str, subject: Subject, lock: Lock | None, *, flavour_tag: str | None = None,
             constraints: str | None = None) -> Sbom:
    """Read the image, assemble, and validate: what `build.py sbom`, `test` and `sign` all write."""
    sbom = assemble(subject, lock, read_inventory(image), flavour_tag=flavour_tag, tool_version=_tool_version(),
                    constraints=constraints)
    validate(sbom.to_json(), where=f"the SBOM of {subject.ref}")
    return sbom


def write(sbom: Sbom, path: Path) -> Path:
    """Write atomically: a reader (an upload, an attestation) never sees half a document."""
    # diskio: a unique temporary name created exclusively (a link planted at a fixed `.NAME.tmp` is never
    # written through), removed on any failure or Ctrl-C.
    diskio.write_text_atomic(path, sbom.to_json(), "the SBOM", shared=True)
    return path


def flavour_of(plan: Plan, name: str) -> Target | None:
    """The plan's flavour named by a tag or alias, else None."""
    for flavour in plan.flavours:
        if name in flavour.tags:
            return flavour
    return None


def image_sbom(plan: Plan, flavour: Target | None, image: str, subject: Subject,
               say: Callable[[str], None]) -> Sbom:
    """The SBOM of `image`, with the flavour's lock when it is one of the plan's flavours; notes and mismatches
    are said, not raised: a locked package the image lacks is a warning."""
    lock = None
    if flavour is not None and plan.lock_path(flavour).is_file():
        lock = lockfile.read_lock(plan.lock_path(flavour))
    constraints = plan.rendered[flavour.tag].get(CONSTRAINTS_NAME) if flavour is not None else None
    made = generate(image, subject, lock, flavour_tag=flavour.tag if flavour else None, constraints=constraints)
    for line in made.notes:
        say(f"note: {line}")
    for line in made.mismatches:
        say(f"warning: {line}")
    return made


def write_report(plan: Plan, flavour: Target, image: str, directory: Path, say: Callable[[str], None]) -> Path:
    """reports/<tag>/sbom.cdx.json of a built image (what `build.py test` leaves beside checks.json)."""
    made = image_sbom(plan, flavour, image, local_subject(image), say)
    return write(made, directory / SBOM_NAME)


def local_subject(image: str) -> Subject:
    """The subject for an image on the engine: its manifest digest when it came from a registry."""
    attrs = engine.images.image_inspect(image)
    if attrs is None:
        raise Failure(f"image {image} is not on this engine", rule="image-exists",
                      hint="build it (`build.py build TAG`) or pull it (`build.py pull ...`) first")
    name, digest = _repo_digest(image, attrs.get("RepoDigests") or [])
    tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] and "@" not in image else None
    return Subject(name=name or _repository(image), image_id=str(attrs["Id"]), tag=tag, digest=digest)


def _repository(image: str) -> str:
    if "@" in image:
        return image.split("@", 1)[0]
    head, _, last = image.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def _repo_digest(image: str, repo_digests: Iterable[str]) -> tuple[str | None, str | None]:
    """The digest of the image as its repository serves it, if the engine knows one."""
    wanted = _repository(image)
    for entry in repo_digests:
        name, _, digest = entry.partition("@")
        if name == wanted:
            return name, digest
    return None, None


def _tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0"


def sbom_command(plan: Plan, name: str, output: Path | None, say: Callable[[str], None]) -> tuple[Sbom, Subject]:
    """`build.py sbom NAME`: the SBOM of a flavour's local image (a tag or alias) or of any image reference,
    with the lock of the flavour the image's tag label names; written to `output` when one is given."""
    flavour = flavour_of(plan, name)
    image = local_ref(flavour.tag) if flavour is not None else name
    if flavour is None and not any(ch in name for ch in ":/@"):
        raise ConfigError(f"{name!r} is neither a flavour of the matrix nor an image reference",
                          rule="flavour-exists", hint="`build.py list` shows the tags; images look like REPO:TAG")
    subject = local_subject(image)
    if flavour is None:
        labelled = (engine.images.image_labels(image) or {}).get(TAG_LABEL)
        flavour = flavour_of(plan, labelled) if labelled else None
    made = image_sbom(plan, flavour, image, subject, say)
    if output is not None:
        write(made, output)
    return made, subject
