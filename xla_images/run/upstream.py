"""`build.py update`: the torch_xla releases the index has and the matrix lacks, added from the index's facts.

For every torch_xla release on the index newer than the matrix's newest (or each one named), this reads:
* the release's files on the index (simple API), and one torch_xla wheel's METADATA and torch_xla/version.py by
  HTTP range requests (run.index): the `tpu` extra's `libtpu==` pin, a `torch==` pin if the wheel has one, and
  the commits the wheel was built from;
* torch's and libtpu's files, for the pythons each has x86_64 Linux wheels for.
torch_xla's wheels pin no torch (2.6 to 2.9 do not): torch is then the newest torch release of torch_xla's
major.minor that is not newer than torch_xla itself (2.8.1 -> 2.8.0, 2.9.0 -> 2.9.0), which is how upstream pairs
them. The git revisions are the release tags (`v<torch>`, `v<torch_xla>`, what wheel-builds/ checks out); the
wheel's own commits are printed for the reviewer, as which tag points at a commit only the git host knows.

generate.update turns the facts into the matrix edit; nothing is written unless the edited matrix validates.
The wheel facts of every pin the matrix then holds are written to matrix.wheels.json (model.wheel_index), where
validation checks them offline.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from .. import diskio, userfiles, yamlsrc
from ..errors import ConfigError, Failure, Location, shown_value
from ..generate import update as decide_update
from ..generate.update import ReleaseFacts
from ..model import matrix, wheel_index
from ..model.flavour import Channel
from ..model.site import Site
from .index import Index, IndexFile, parse_metadata

_COMMIT = re.compile(r"""__(xla|torch)_gitrev__\s*=\s*['"]([0-9a-f]{7,64})['"]""")
# The python a wheel is read for when several exist: any x86_64 Linux one carries the same METADATA.
_WHEEL_PLATFORM = re.compile(r"(many)?linux[_0-9a-z]*_x86_64")


@dataclass(frozen=True)
class UpdateResult:
    matrix_path: Path
    before: str
    after: str
    diff: str
    added: tuple[str, ...]
    facts: tuple[ReleaseFacts, ...]
    cache_before: str
    cache_after: str
    index_url: str

    @property
    def missing(self) -> bool:
        """Upstream has a release the matrix lacks (what `--check` fails on)."""
        return bool(self.added)

    @property
    def cache_path(self) -> Path:
        return self.matrix_path.parent / wheel_index.WHEELS_FILE


def plan_update(matrix_path: Path, site: Site, releases: tuple[str, ...] = (), index: Index | None = None,
                progress: Callable[[str], None] = lambda line: None) -> UpdateResult:
    """Read the index and work out the edit; writes nothing."""
    shown = str(matrix_path)
    for release in releases:
        if not matrix.RELEASE_VERSION.fullmatch(release):
            raise ConfigError(f"--release {shown_value(release)} is not a torch_xla version like 2.9.0",
                              location=Location("--release"), rule="update-release",
                              hint="name a release as the index lists it: X.Y.Z")
    before = userfiles.read_text(matrix_path, limit=userfiles.YAML_LIMIT)
    doc = yamlsrc.loads(before, shown)
    flavours = matrix.expand(doc)
    defaults = matrix.matrix_defaults(doc)
    index = index or Index(_index_url(site, doc, defaults), _ca(site))
    progress(f"reading {index.url}")
    files = {project: index.files(project) for project in wheel_index.PACKAGES}
    known = {flavour.torch_xla for flavour in flavours if flavour.channel is Channel.RELEASE}
    wanted = _wanted(files["torch-xla"], known, releases, index.url)
    facts = []
    for version in wanted:
        progress(f"torch_xla {version}: reading its wheel's METADATA")
        facts.append(release_facts(index, version, files))
    decisions = [decide_update.decide(item, defaults["pythons"], defaults["accelerators"]) for item in facts]
    edit = decide_update.edit_matrix(before, shown, decisions)
    cache = _cache(index.url, edit.text, shown, files)
    decide_update.validate(edit.text, shown, site, cache)
    cache_path = matrix_path.parent / wheel_index.WHEELS_FILE
    cache_before = cache_path.read_text(encoding="utf-8") if cache_path.is_file() else ""
    return UpdateResult(matrix_path, before, edit.text, decide_update.diff(before, edit.text, shown), edit.added,
                        tuple(item for item in facts if item.torch_xla in edit.added), cache_before, cache.dumps(),
                        index.url)


def write_update(result: UpdateResult) -> list[Path]:
    """Write the edited matrix and the wheel cache (atomically), only where they changed."""
    written = []
    if result.after != result.before:
        diskio.write_text_atomic(result.matrix_path, result.after, "the matrix")
        written.append(result.matrix_path)
    if result.cache_after != result.cache_before:
        diskio.write_text_atomic(result.cache_path, result.cache_after, "the wheel cache")
        written.append(result.cache_path)
    return written


def release_facts(index: Index, version: str, files: dict[str, list[IndexFile]]) -> ReleaseFacts:
    """The facts of torch_xla `version` from the index's files and one of its wheels."""
    names = {project: [file.filename for file in found] for project, found in files.items()}
    xla_wheels = wheel_index.wheel_pythons(names["torch-xla"], "torch-xla", version)
    wheel = _a_wheel(files["torch-xla"], version)
    metadata_text = index.wheel_member(wheel, _is_metadata)
    if metadata_text is None:
        raise Failure(f"{wheel.url} has no .dist-info/METADATA", location=wheel.url, rule="wheel-metadata",
                      hint="the index serves a damaged wheel; pin another release with --release")
    pins = metadata_pins(metadata_text, wheel.url)
    version_py = index.wheel_member(wheel, lambda name: name == "torch_xla/version.py") or ""
    commits = dict(match.groups() for match in _COMMIT.finditer(version_py))
    torch = pins.get("torch") or _paired_torch(names["torch"], version, index.url)
    libtpu = pins.get("libtpu")
    wheels = {"torch-xla": xla_wheels, "torch": wheel_index.wheel_pythons(names["torch"], "torch", torch)}
    notes = []
    if libtpu:
        wheels["libtpu"] = wheel_index.wheel_pythons(names["libtpu"], "libtpu", libtpu)
        if not wheels["libtpu"]:
            notes.append(f"libtpu {libtpu} (the tpu extra's pin) has no x86_64 Linux wheel on the index")
    return ReleaseFacts(version, torch, libtpu, wheels, commits.get("xla", ""), commits.get("torch", ""),
                        tuple(notes))


def metadata_pins(text: str, url: str) -> dict[str, str]:
    """`torch` and (from the `tpu` extra) `libtpu` exact pins in a METADATA text."""
    message = parse_metadata(text)
    if not message.get("Name") or not message.get("Version"):
        raise Failure(f"the METADATA of {url} has no Name or Version", location=url, rule="wheel-metadata")
    pins: dict[str, str] = {}
    for line in message.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            raise Failure(f"the METADATA of {url} has an invalid Requires-Dist {shown_value(line)}", location=url,
                          rule="wheel-metadata") from None
        name = requirement.name.lower().replace("_", "-")
        exact = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
        if name == "torch" and exact:
            pins["torch"] = _plain_version(exact[0], url, "torch")
        # The tpu extra: libtpu is pinned exactly (2.6's extra also wants a GCS-only libtpu-nightly: ignored).
        if name == "libtpu" and exact and requirement.marker and requirement.marker.evaluate({"extra": "tpu"}):
            pins["libtpu"] = _plain_version(exact[0], url, "libtpu")
    return pins


def _plain_version(text: str, url: str, what: str) -> str:
    if not matrix.PACKAGE_VERSION.fullmatch(text):
        raise Failure(f"the METADATA of {url} pins {what} {shown_value(text)}, not a release version",
                      location=url, rule="wheel-metadata", hint="add this release by hand")
    return text


def _paired_torch(torch_files: list[str], version: str, url: str) -> str:
    minor = Version(version).release[:2]
    candidates = sorted({Version(found) for found in _release_versions(torch_files, "torch")
                         if Version(found).release[:2] == minor and Version(found) <= Version(version)})
    if not candidates:
        raise Failure(f"no torch {minor[0]}.{minor[1]}.x release on {url} to pair torch_xla {version} with",
                      location=url, rule="update-facts", hint="add this release by hand")
    return str(candidates[-1])


def _release_versions(filenames: list[str], project: str) -> set[str]:
    """Versions with an x86_64 Linux wheel that are plain releases (no pre-release, dev or local label)."""
    found = set()
    for filename in filenames:
        parts = filename[:-4].split("-") if filename.endswith(".whl") else []
        if len(parts) not in (5, 6) or not any(_WHEEL_PLATFORM.fullmatch(p) for p in parts[-1].split(".")):
            continue
        try:
            version = Version(parts[1])
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease or version.local) \
                and matrix.RELEASE_VERSION.fullmatch(str(version)) and len(version.release) == 3:
            found.add(str(version))
    return found


def _wanted(files: list[IndexFile], known: set[str], releases: tuple[str, ...], url: str) -> list[str]:
    available = _release_versions([file.filename for file in files], "torch-xla")
    if releases:
        absent = [release for release in releases if release not in available]
        if absent:
            raise ConfigError(f"torch_xla {', '.join(absent)} has no x86_64 Linux release wheel on {url}",
                              location=Location(url), rule="update-release",
                              hint=f"releases there: {', '.join(sorted(available, key=Version)[-6:])}")
        return sorted(set(releases) - known, key=Version)
    newest = max((Version(version) for version in known), default=None)
    return sorted((version for version in available if newest is None or Version(version) > newest), key=Version)


def _a_wheel(files: list[IndexFile], version: str) -> IndexFile:
    for file in files:
        parts = file.filename[:-4].split("-") if file.filename.endswith(".whl") else []
        if len(parts) == 5 and parts[1] == version and _WHEEL_PLATFORM.fullmatch(parts[-1].split(".")[0]):
            return file
    raise Failure(f"torch_xla {version} has no x86_64 Linux wheel to read", rule="update-facts")


def _is_metadata(name: str) -> bool:
    return name.count("/") == 1 and name.endswith(".dist-info/METADATA")


def _cache(url: str, text: str, shown: str, files: dict[str, list[IndexFile]]) -> wheel_index.WheelIndex:
    """The wheel facts of every pin the (edited) matrix holds, from the file lists already read."""
    flavours = matrix.expand(yamlsrc.loads(text, shown))
    cache = wheel_index.WheelIndex(url)
    for project in wheel_index.PACKAGES:
        filenames = [file.filename for file in files[project]]
        versions = {version for flavour in flavours if flavour.channel is Channel.RELEASE
                    for name, version in wheel_index.pins(flavour) if name == project}
        cache = cache.merged(project, {version: wheel_index.wheel_pythons(filenames, project, version)
                                       for version in versions})
    return cache


def _index_url(site: Site, doc: yamlsrc.YamlDoc, defaults: dict) -> str:
    """The index of the wheel source that serves the matrix's newest release in its default ABI."""
    releases = doc.data.get("releases", {}) if isinstance(doc.data, dict) else {}
    newest = max((key for key in releases if matrix.RELEASE_VERSION.fullmatch(key)), key=Version, default="0.0.0")
    rule = site.wheel_source_for(newest, defaults["default_abi"])
    if rule is None:
        return wheel_index.PUBLIC_INDEX
    if rule.source.wheelhouse is not None:
        raise ConfigError(f"the wheel source {rule.source.name} of torch_xla {newest} is a wheelhouse, not an index",
                          location=Location(rule.declared_at), rule="update-index",
                          hint="update reads a package index: give that source an index_url, or none (the "
                               "public index)")
    return wheel_index.index_of(rule.source.index_url)


def _ca(site: Site) -> str | None:
    bundle = site.ca_bundle()
    return str(bundle) if bundle else None
