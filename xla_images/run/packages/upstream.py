"""`build.py update`: the torch_xla releases the index has and the matrix lacks, added from the index's facts.

For every torch_xla release on the index newer than the matrix's newest (or each one named), this reads:
* the release's files on the index (simple API), and one torch_xla wheel's METADATA and torch_xla/version.py by
  HTTP range requests (run.packages.index): the `tpu` extra's `libtpu==` pin, a `torch==` pin if the wheel has one, and
  the commits the wheel was built from;
* torch's and libtpu's files, for the pythons each has x86_64 Linux wheels for;
* the companions (torchvision, torchaudio): the newest release of each whose METADATA pins the release's torch
  exactly (`torch==2.9.0`), read newest first with the same range requests, stopping at a pin below that torch
  (the pins rise with the companion's version) or after MAX_COMPANION_READS wheels. They are written for a new
  release, and added to a release the matrix already has without them (UpdateResult.filled). An index that has
  no page for a companion records none (a warning), as does a torch no companion pins.
torch_xla's wheels pin no torch (2.6 to 2.9 do not): torch is then the newest torch release of torch_xla's
major.minor that is not newer than torch_xla itself (2.8.1 -> 2.8.0, 2.9.0 -> 2.9.0), which is how upstream pairs
them. The git revisions are the release tags (`v<torch>`, `v<torch_xla>`, what wheel-builds/ checks out); the
wheel's own commits are printed for the reviewer, as which tag points at a commit only the git host knows.

generate.update turns the facts into the matrix edit; nothing is written unless the edited matrix validates.
The wheel facts of every pin the matrix then holds are written to matrix.wheels.json (model.wheel_index), where
validation checks them offline.
"""
from __future__ import annotations

import email.message
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ... import diskio, userfiles, yamlsrc
from ...errors import ConfigError, Failure, Location, redacted, shown_value, without_credentials
from ...generate import update as decide_update
from ...generate.update import ReleaseFacts
from ...model import matrix, wheel_index
from ...model.flavour import COMPANIONS, Channel
from ...model.site import Site
from .index import Index, IndexFile, NotFound, parse_metadata

# The pythons a METADATA's markers are evaluated for when the caller names none (the matrix's usual ones).
DEFAULT_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# A Requires-Dist line: real ones are under 200 characters.
MAX_REQUIREMENT = 4096
_COMMIT = re.compile(r"""__(xla|torch)_gitrev__\s*=\s*['"]([0-9a-f]{7,64})['"]""")
# The python a wheel is read for when several exist: any x86_64 Linux one carries the same METADATA.
_WHEEL_PLATFORM = re.compile(r"(many)?linux[_0-9a-z]*_x86_64")
# Companion wheels read for one torch at most: from the newest companion release down to the one that pins a
# torch four minor releases back is ~15 (torchvision 0.29.2 down to 0.21.0 for torch 2.6.0, 2026-12).
MAX_COMPANION_READS = 24


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
    index_url: str  # as printed: credentials redacted
    # One line each: what the index has that update did not take (a yanked release, one that skips releases).
    warnings: tuple[str, ...] = ()
    # Releases the matrix had without their companion versions, and the settings added to each.
    filled: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    @property
    def missing(self) -> bool:
        """Upstream has a release the matrix lacks, or companions of one it has (what `--check` fails on)."""
        return bool(self.added or self.filled)

    @property
    def cache_path(self) -> Path:
        """Beside the matrix file itself (a symlinked matrix's target), where validation reads it (plan)."""
        return userfiles.resolve_path(self.matrix_path).parent / wheel_index.WHEELS_FILE


def plan_update(matrix_path: Path, site: Site, releases: tuple[str, ...] = (), index: Index | None = None,
                progress: Callable[[str], None] = lambda line: None, allow: tuple[str, ...] = ()) -> UpdateResult:
    """Read the index and work out the edit; writes nothing. `allow`: releases taken although they skip more
    than a minor release (`--allow`)."""
    shown = str(matrix_path)
    for option, values in (("--release", releases), ("--allow", allow)):
        for release in values:
            if not matrix.RELEASE_VERSION.fullmatch(release):
                raise ConfigError(f"{option} {shown_value(release)} is not a torch_xla version like 2.9.0",
                                  location=Location(option), rule="update-release",
                                  hint="name a release as the index lists it: X.Y.Z")
    before = userfiles.read_text(matrix_path, limit=userfiles.YAML_LIMIT)
    doc = yamlsrc.loads(before, shown)
    flavours = matrix.expand(doc)
    defaults = matrix.matrix_defaults(doc)
    index = index or Index(_index_url(site, doc, defaults), _ca(site))
    progress(f"reading {redacted(index.url)}")
    warnings: list[str] = []
    listed = {project: index.files(project) for project in wheel_index.PACKAGES if project not in COMPANIONS}
    listed.update((name, _companion_files(index, name, warnings)) for name in COMPANIONS)
    # PEP 592: a yanked file is withdrawn; nothing update proposes or records comes from one.
    files = {project: [file for file in found if not file.yanked] for project, found in listed.items()}
    known = {flavour.torch_xla for flavour in flavours if flavour.channel is Channel.RELEASE}
    yanked = _release_versions([file.filename for file in listed["torch-xla"]]) \
        - _release_versions([file.filename for file in files["torch-xla"]])
    warnings += [f"torch_xla {version} is yanked on the index (PEP 592): not proposed"
                 for version in sorted(yanked, key=Version) if _newer_than(version, known) and not releases]
    wanted = _wanted(files["torch-xla"], known, releases, index.url, yanked)
    wanted = _without_jumps(wanted, known, bool(releases), allow, warnings)
    facts, memo, recorded = [], {}, _recorded_companions(flavours)
    for version in wanted:
        progress(f"torch_xla {version}: reading its wheel's METADATA")
        facts.append(release_facts(index, version, files, defaults["pythons"], memo, recorded))
    decisions = [decide_update.decide(item, defaults["pythons"], defaults["accelerators"]) for item in facts]
    edit = decide_update.edit_matrix(before, shown, decisions)
    text, filled = _fill_companions(edit.text, shown, index, files, defaults["pythons"], memo, warnings, progress,
                                    recorded)
    edit = decide_update.Edit(text, edit.added)
    cache = _cache(without_credentials(index.url), edit.text, shown, files)
    decide_update.validate(edit.text, shown, site, cache)
    cache_path = userfiles.resolve_path(matrix_path).parent / wheel_index.WHEELS_FILE
    cache_before = userfiles.read_optional(cache_path, limit=userfiles.JSON_LIMIT, follow_symlinks=True) or ""
    return UpdateResult(matrix_path, before, edit.text, decide_update.diff(before, edit.text, shown), edit.added,
                        tuple(item for item in facts if item.torch_xla in edit.added), cache_before, cache.dumps(),
                        redacted(index.url), tuple(warnings), filled)


def write_update(result: UpdateResult) -> list[Path]:
    """Write the edited matrix and the wheel cache (atomically), only where they changed.

    Both are the user's committed files: each keeps its mode, and a symlinked one stays a link whose target is
    rewritten (diskio.replace_in_place). Returns the paths as the user named them.

    A matrix linked into another folder is refused before anything is written (`disk-outside`): the wheel cache
    and the Dockerfiles `update --write` renders belong beside the matrix file itself (where validation reads
    them), and that would be outside the folder the user named (issue 41: a checkout whose matrix.yaml linked
    to a shared one got Dockerfiles/ and matrix.wheels.json written beside the shared file).
    """
    _refuse_a_matrix_linked_elsewhere(result.matrix_path)
    written = []
    if result.after != result.before:
        diskio.replace_in_place(result.matrix_path, result.after, "the matrix")
        written.append(result.matrix_path)
    if result.cache_after != result.cache_before:
        diskio.replace_in_place(result.cache_path, result.cache_after, "the wheel cache")
        written.append(result.cache_path)
    return written


def _refuse_a_matrix_linked_elsewhere(matrix_path: Path) -> None:
    if not matrix_path.is_symlink():
        return
    target = userfiles.resolve_path(matrix_path)
    if target.parent == userfiles.resolve_path(matrix_path.parent):
        return  # matrix.yaml -> matrix.prod.yaml: the derived files land in the same folder
    raise ConfigError(f"{matrix_path} is a link to {target}: `update --write` would rewrite it and write "
                      f"{wheel_index.WHEELS_FILE} and Dockerfiles/ beside it, outside {matrix_path.parent}",
                      location=Location(str(matrix_path)), rule="disk-outside",
                      hint=f"run update --write with --matrix {target} in that folder, or copy the file here "
                           "instead of linking it")


def release_facts(index: Index, version: str, files: dict[str, list[IndexFile]],
                  pythons: tuple[str, ...] = DEFAULT_PYTHONS, memo: dict[str, str | None] | None = None,
                  recorded: dict[str, str] | None = None) -> ReleaseFacts:
    """The facts of torch_xla `version` from the index's files and one of its wheels. `pythons`: those the
    matrix builds; the wheel's markers are evaluated for the ones torch_xla has wheels for (not this host's)."""
    names = {project: [file.filename for file in found] for project, found in files.items()}
    xla_wheels = wheel_index.wheel_pythons(names["torch-xla"], "torch-xla", version)
    wheel = _a_wheel(files["torch-xla"], version)
    metadata_text = index.wheel_member(wheel, _is_metadata)
    if metadata_text is None:
        raise Failure(f"{wheel.url} has no .dist-info/METADATA", location=wheel.url, rule="wheel-metadata",
                      hint="the index serves a damaged wheel; pin another release with --release")
    served = tuple(python for python in pythons if wheel_index.serves(xla_wheels, python)) or pythons
    pins = metadata_pins(metadata_text, wheel.url, version, served)
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
    companions = companion_versions(index, torch, files, pythons, {} if memo is None else memo, notes, recorded)
    notes += [f"no {name} on the index pins torch {torch}: none recorded" for name in COMPANIONS
              if name not in companions and files.get(name)]
    return ReleaseFacts(version, torch, libtpu, wheels, commits.get("xla", ""), commits.get("torch", ""),
                        tuple(notes), companions)


# --- companions ---------------------------------------------------------------------------------------------

def _companion_files(index: Index, name: str, warnings: list[str]) -> list[IndexFile]:
    """The companion's files; none (and a warning) where the index has no page for it (a private index)."""
    try:
        return index.files(name)
    except NotFound:
        warnings.append(f"the index has no {name}: no {name} version is recorded")
        return []


def companion_versions(index: Index, torch: str, files: dict[str, list[IndexFile]], pythons: tuple[str, ...],
                       memo: dict[str, str | None], skipped: list[str] | None = None,
                       recorded: dict[str, str] | None = None) -> dict[str, str]:
    """Companion -> its newest release whose METADATA pins `torch` exactly (absent when none does).

    `memo`: wheel URL -> the torch it pins (None: no exact pin), so one update reads each wheel once. Under
    torch_xla's rules: `files` holds no yanked file (plan_update drops them), and a release that skips more than
    a minor release after the newest the matrix records (`recorded`; 0.24.0 -> 9999.0.0) is never taken;
    `skipped` gets a line for each.
    """
    found = {}
    for name in COMPANIONS:
        names = [file.filename for file in files.get(name, [])]
        for version in _plausible(name, _release_versions(names), recorded or {}, skipped)[:MAX_COMPANION_READS]:
            wheel = _a_wheel(files[name], version, name)
            if wheel.url not in memo:
                text = index.wheel_member(wheel, _is_metadata)
                if text is None:
                    raise Failure(f"{wheel.url} has no .dist-info/METADATA", location=wheel.url,
                                  rule="wheel-metadata", hint="the index serves a damaged wheel")
                memo[wheel.url] = metadata_pins(text, wheel.url, version, pythons, project=name).get("torch")
            pinned = memo[wheel.url]
            if pinned == torch:
                found[name] = version
                break
            if pinned is not None and Version(pinned) < Version(torch):
                break  # older companions pin older torches
    return found


def _plausible(name: str, versions: set[str], recorded: dict[str, str], skipped: list[str] | None) -> list[str]:
    """`versions` newest first, without those newer than the matrix's newest of `name` that skip more than a
    minor release after it (0.24.0 -> 9999.0.0): as for torch_xla, a made-up or mistyped version on an index must
    not become a recorded companion (issue 41). With none recorded, nothing to compare with (as for torch_xla)."""
    newest = Version(recorded[name]) if name in recorded else None
    kept = []
    for version in sorted(versions, key=Version, reverse=True):
        if newest is not None and Version(version) > newest and _jumps(newest, Version(version)):
            if skipped is not None:
                skipped.append(f"{name} {version} skips more than a minor release after {newest}: not recorded")
            continue
        kept.append(version)
    return kept


def _recorded_companions(flavours: list) -> dict[str, str]:
    """Companion -> the newest version any release of the matrix records."""
    newest: dict[str, str] = {}
    for flavour in flavours:
        for name, version in flavour.companion_versions:
            if name not in newest or Version(version) > Version(newest[name]):
                newest[name] = version
    return newest


def _fill_companions(text: str, shown: str, index: Index, files: dict[str, list[IndexFile]],
                     pythons: tuple[str, ...], memo: dict[str, str | None], warnings: list[str],
                     progress: Callable[[str], None], recorded: dict[str, str]
                     ) -> tuple[str, tuple[tuple[str, tuple[tuple[str, str], ...]], ...]]:
    """`text` with the companion versions each release (not a nightly) lacks added, and what was added."""
    releases = yamlsrc.loads(text, shown).data.get("releases")
    filled = []
    for version, settings in (releases.items() if isinstance(releases, dict) else ()):
        if not isinstance(settings, dict) or settings.get("channel") == Channel.NIGHTLY.value \
                or not isinstance(settings.get("torch"), str) or all(name in settings for name in COMPANIONS):
            continue
        progress(f"torch_xla {version}: reading the companions of torch {settings['torch']}")
        versions = companion_versions(index, settings["torch"], files, pythons, memo, warnings, recorded)
        added = decide_update.companion_settings({name: value for name, value in versions.items()
                                                  if name not in settings})
        if not added:
            continue
        edited = decide_update.fill(text, shown, version, added)
        if edited is None:
            warnings.append(f"release {version} is written in flow style: add "
                            + ", ".join(f"{key}: {value}" for key, value in added) + " to it by hand")
            continue
        text = edited
        filled.append((version, tuple(added)))
    return text, tuple(filled)


def metadata_pins(text: str, url: str, version: str | None = None,
                  pythons: tuple[str, ...] = DEFAULT_PYTHONS, project: str = "torch-xla") -> dict[str, str]:
    """`torch` and (from the `tpu` extra) `libtpu` exact pins in a METADATA text.

    The METADATA must be `project`'s (torch_xla's unless a companion's is read), of `version` when given: an index
    that serves another project's wheel under its name would otherwise give its pins. A requirement's markers are evaluated for each of
    `pythons` on x86_64 Linux (what images run), never for the host running update: it counts when it applies
    to one of them.
    """
    message = parse_metadata(text)
    _check_identity(message, url, version, project)
    found: dict[str, set[str]] = {}
    for line in message.get_all("Requires-Dist") or []:
        requirement = _requirement(line, url)
        name = canonicalize_name(requirement.name)
        exact = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
        # The tpu extra: libtpu is pinned exactly (2.6's extra also wants a GCS-only libtpu-nightly: ignored).
        extra = {"torch": "", "libtpu": "tpu"}.get(name)
        if extra is None or not exact or not _applies(requirement, extra, pythons, url):
            continue
        found.setdefault(name, set()).add(_plain_version(exact[0], url, name))
    pins = {}
    for name, versions in found.items():
        if len(versions) > 1:
            raise Failure(f"the METADATA of {url} pins {name} {' and '.join(sorted(versions))} for different "
                          "pythons; the matrix holds one pin per release", location=url, rule="update-facts",
                          hint="add this release by hand")
        pins[name] = versions.pop()
    return pins


def _check_identity(message: email.message.Message, url: str, version: str | None, project: str) -> None:
    name, written = message.get("Name"), message.get("Version")
    if not name or not written:
        raise Failure(f"the METADATA of {url} has no Name or Version", location=url, rule="wheel-metadata")
    try:
        same_version = version is None or Version(str(written)) == Version(version)
    except InvalidVersion:
        same_version = False
    if canonicalize_name(str(name)) != canonicalize_name(project) or not same_version:
        shown_project = project.replace("-", "_")
        raise Failure(f"the METADATA of {url} is {shown_value(str(name), 40)} {shown_value(str(written), 40)}, not "
                      f"{shown_project} {version or ''}".rstrip(), location=url, rule="wheel-metadata",
                      hint=f"the index serves another project's wheel under {shown_project}'s name; report it to the "
                           "index's owner, or pin another release with --release")


def _requirement(line: str, url: str) -> Requirement:
    if len(line) > MAX_REQUIREMENT:
        raise Failure(f"the METADATA of {url} has a Requires-Dist of {len(line)} characters", location=url,
                      rule="wheel-metadata")
    try:
        return Requirement(line)
    except InvalidRequirement:
        raise Failure(f"the METADATA of {url} has an invalid Requires-Dist {shown_value(line)}", location=url,
                      rule="wheel-metadata") from None
    except RecursionError:  # markers nested deeper than the parser recurses
        raise Failure(f"the METADATA of {url} has a Requires-Dist nested too deep: {shown_value(line)}",
                      location=url, rule="wheel-metadata") from None


def _applies(requirement: Requirement, extra: str, pythons: tuple[str, ...], url: str) -> bool:
    """Whether the requirement's marker holds, with `extra`, for one of `pythons` on x86_64 Linux."""
    if requirement.marker is None:
        return True
    try:
        return any(requirement.marker.evaluate(_environment(python, extra)) for python in pythons)
    except (RecursionError, ValueError, TypeError) as error:  # packaging's marker errors are ValueErrors
        raise Failure(f"the METADATA of {url} has a marker that cannot be evaluated: "
                      f"{shown_value(str(requirement.marker))} ({type(error).__name__})", location=url,
                      rule="wheel-metadata") from None


def _environment(python: str, extra: str) -> dict[str, str]:
    """PEP 508 marker variables of a CPython `python` on x86_64 Linux (an image), with `extra`."""
    return {"python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
            "implementation_version": f"{python}.0", "platform_python_implementation": "CPython",
            "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "extra": extra}


def _plain_version(text: str, url: str, what: str) -> str:
    if not matrix.PACKAGE_VERSION.fullmatch(text):
        raise Failure(f"the METADATA of {url} pins {what} {shown_value(text)}, not a release version",
                      location=url, rule="wheel-metadata", hint="add this release by hand")
    return text


def _paired_torch(torch_files: list[str], version: str, url: str) -> str:
    minor = Version(version).release[:2]
    candidates = sorted({Version(found) for found in _release_versions(torch_files)
                         if Version(found).release[:2] == minor and Version(found) <= Version(version)})
    if not candidates:
        raise Failure(f"no torch {minor[0]}.{minor[1]}.x release on {url} to pair torch_xla {version} with",
                      location=url, rule="update-facts", hint="add this release by hand")
    return str(candidates[-1])


def _release_versions(filenames: list[str]) -> set[str]:
    """Versions with an x86_64 Linux wheel that are plain releases (no pre-release, dev or local label)."""
    found = set()
    for filename in filenames:
        parsed = wheel_index.parse_wheel(filename)
        if parsed is None or not _x86_64_linux(parsed[2]):
            continue
        version = parsed[1]
        if not (version.is_prerelease or version.is_devrelease or version.local) \
                and matrix.RELEASE_VERSION.fullmatch(str(version)) and len(version.release) == 3:
            found.add(str(version))
    return found


def _wanted(files: list[IndexFile], known: set[str], releases: tuple[str, ...], url: str,
            yanked: set[str]) -> list[str]:
    available = _release_versions([file.filename for file in files])
    if releases:
        absent = [release for release in releases if release not in available]
        if absent:
            why = "is yanked (PEP 592)" if set(absent) <= yanked else "has no x86_64 Linux release wheel"
            raise ConfigError(f"torch_xla {', '.join(absent)} {why} on {url}",
                              location=Location(url), rule="update-release",
                              hint=f"releases there: {', '.join(sorted(available, key=Version)[-6:])}")
        return sorted(set(releases) - known, key=Version)
    return sorted((version for version in available if _newer_than(version, known)), key=Version)


def _newer_than(version: str, known: set[str]) -> bool:
    return all(Version(version) > Version(other) for other in known)


def _without_jumps(wanted: list[str], known: set[str], named: bool, allow: tuple[str, ...],
                   warnings: list[str]) -> list[str]:
    """`wanted` without the releases newer than the matrix's that skip more than a minor release (2.9.0 ->
    2.11.0, 9999.0.0) unless `allow`ed: a made-up or mistyped version on an index must not become a release.

    Each is compared with the newest release before it, in the matrix or taken here. A release named with
    --release is refused (update-jump); one found on the index is left out with a warning.
    """
    newest = max((Version(version) for version in known), default=None)
    taken = []
    for version in wanted:
        current = Version(version)
        if newest is not None and current > newest and version not in allow and _jumps(newest, current):
            message = (f"torch_xla {version} skips more than a minor release after {newest}")
            if named:
                raise ConfigError(message, location=Location("--release"), rule="update-jump",
                                  hint=f"if {version} is real, add --allow {version}")
            warnings.append(f"{message}: not proposed (--allow {version} takes it)")
            continue
        taken.append(version)
        newest = current if newest is None or current > newest else newest
    return taken


def _jumps(previous: Version, current: Version) -> bool:
    """More than one minor release from `previous` to `current`: 2.9 -> 2.10 and 2.9 -> 3.0 do not jump."""
    (major, minor), (new_major, new_minor) = previous.release[:2], current.release[:2]
    if new_major == major:
        return new_minor > minor + 1
    return new_major != major + 1 or new_minor > 0


def _x86_64_linux(tags: frozenset) -> bool:
    return any(_WHEEL_PLATFORM.fullmatch(tag.platform) for tag in tags)


def _a_wheel(files: list[IndexFile], version: str, project: str = "torch_xla") -> IndexFile:
    """An x86_64 Linux wheel of `version` to read (build-tagged names too: `torchvision-0.24.0-1-cp311-...`)."""
    wanted = Version(version)
    for file in files:
        parsed = wheel_index.parse_wheel(file.filename)
        if parsed is not None and parsed[1] == wanted and _x86_64_linux(parsed[2]):
            return file
    raise Failure(f"{project} {version} has no x86_64 Linux wheel to read", rule="update-facts")


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
        if not versions:  # a companion no flavour installs: nothing validation checks
            continue
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
    return wheel_index.source_url(rule.source.index_url)


def _ca(site: Site) -> str | None:
    bundle = site.ca_bundle()
    return str(bundle) if bundle else None
