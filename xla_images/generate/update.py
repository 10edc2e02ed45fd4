"""What a torch_xla release's upstream facts mean for matrix.yaml: the edit, as new text and a diff.

`run.packages.upstream` reads the facts from the package index; this module decides, without the network:
* the release block: torch, the git revisions, python_support (the pythons for which torch_xla and torch both
  have wheels), libtpu (the `tpu` extra's exact pin);
* the companions (torchvision, torchaudio): the version of each whose METADATA pins the release's torch, a
  setting of its own (`torchvision: "0.24.0"`), also added to a release the matrix has without it (`fill`);
* the excludes that follow: a python the release builds whose libtpu pin has no wheel is a tpu flavour that
  cannot be locked (2.9.0 / libtpu 0.0.21 / 3.13), so it is excluded, with a comment that says why;
* the text edit: matrix.yaml is edited as text at the positions its loader recorded (yamlsrc), so every comment,
  blank line and the order of what is there stay as written; the release goes before the first newer one.

`validate` checks the new text as a whole (every matrix rule, the site's, and wheel-python against the facts just
read); run.packages.upstream calls it before anything is written, so an edit that does not validate is an error, not a file.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from packaging.version import Version

from .. import yamlsrc
from ..errors import ConfigError, Failure, Location
from ..model import matrix, wheel_index
from ..model.flavour import COMPANIONS, Accelerator
from ..model.site import Site
from ..model.target import bind
from .plan import check_wheels

RULE = "update-edit"


@dataclass(frozen=True)
class ReleaseFacts:
    """What the index says about one torch_xla release (run.packages.upstream reads it)."""

    torch_xla: str
    torch: str
    libtpu: str | None
    # Python entries (wheel_index.wheel_pythons) of each pinned project's x86_64 Linux wheels.
    wheels: dict[str, tuple[str, ...]]
    # The commits the wheel was built from (torch_xla/version.py), for the reviewer: tags are what builds check
    # out, and which tag points at a commit only the git host knows.
    xla_commit: str = ""
    torch_commit: str = ""
    notes: tuple[str, ...] = field(default=())
    # Companion -> the version whose METADATA pins this torch (none found: absent).
    companions: dict[str, str] = field(default_factory=dict)

    def serves(self, project: str, python: str) -> bool:
        return wheel_index.serves(self.wheels.get(project, ()), python)


@dataclass(frozen=True)
class Decision:
    """The release block's settings and the excludes, in the order they are written."""

    torch_xla: str
    settings: tuple[tuple[str, str], ...]
    excludes: tuple[tuple[str, str], ...]  # (comment, flow mapping)
    pythons: tuple[str, ...]  # what the release builds


def decide(facts: ReleaseFacts, default_pythons: tuple[str, ...],
           default_accelerators: tuple[Accelerator, ...]) -> Decision:
    """The matrix settings for a release, from its facts and the matrix's defaults."""
    supported = [python for python in _candidates(facts, default_pythons)
                 if facts.serves("torch-xla", python) and facts.serves("torch", python)]
    if not supported:
        raise Failure(f"torch_xla {facts.torch_xla} and torch {facts.torch} share no python with x86_64 Linux "
                      "wheels", rule="update-facts", hint="the index has no buildable wheels for this release")
    low, high = supported[0], supported[-1]
    support = f">={low},<3.{int(high.split('.')[1]) + 1}"
    built = tuple(python for python in default_pythons if python in supported)
    in_range = [python for python in default_pythons if Version(low) <= Version(python) <= Version(high)]
    settings = [("torch", _quoted(facts.torch)), ("pytorch_git_rev", f"v{facts.torch}"),
                ("xla_git_rev", f"v{facts.torch_xla}"), ("python_support", _quoted(support))]
    if built and list(built) != in_range:
        settings.append(("pythons", "[" + ", ".join(_quoted(python) for python in built) + "]"))
    excludes: list[tuple[str, str]] = []
    tpu = Accelerator.TPU in default_accelerators
    tpu_pythons = [python for python in built if facts.libtpu and facts.serves("libtpu", python)]
    if tpu and tpu_pythons:
        settings.append(("libtpu", _quoted(str(facts.libtpu))))
        for python in built:
            if python not in tpu_pythons:
                excludes.append((f"libtpu {facts.libtpu} (torch_xla {facts.torch_xla}'s tpu extra) publishes no "
                                 f"cp{python.replace('.', '')} wheel",
                                 f'{{torch_xla: "{facts.torch_xla}", python: "{python}", accelerator: tpu}}'))
    elif tpu:
        others = [accelerator.value for accelerator in default_accelerators if accelerator is not Accelerator.TPU]
        if not others:
            raise Failure(f"torch_xla {facts.torch_xla} has no libtpu wheel for any python it builds, and the "
                          "matrix builds only tpu flavours", rule="update-facts",
                          hint="add it by hand with a libtpu that has wheels, or add cpu to defaults.accelerators")
        settings.append(("accelerators", "[" + ", ".join(others) + "]"))
    settings += companion_settings(facts.companions)
    return Decision(facts.torch_xla, tuple(settings), tuple(excludes), built)


def companion_settings(versions: dict[str, str]) -> list[tuple[str, str]]:
    """The release settings that record companion versions, in COMPANIONS order."""
    return [(name, _quoted(versions[name])) for name in COMPANIONS if name in versions]


def _candidates(facts: ReleaseFacts, default_pythons: tuple[str, ...]) -> list[str]:
    """The pythons torch_xla names wheels for (or the matrix's, for a pure-python wheel), ascending."""
    named = {entry for entry in facts.wheels.get("torch-xla", ()) if not entry.endswith("+")}
    pythons = named | (set(default_pythons) if len(named) < len(facts.wheels.get("torch-xla", ())) else set())
    return sorted(pythons, key=Version)


def _quoted(text: str) -> str:
    return f'"{text}"'


# --- the text edit ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Edit:
    text: str
    added: tuple[str, ...]


def edit_matrix(text: str, shown: str, decisions: list[Decision]) -> Edit:
    """`text` with each decided release (and its excludes) added, every other line as it was.

    Raises ConfigError (rule update-edit) where the text cannot be edited in place: `releases` or `exclude` written
    in flow style (`{...}`, `[...]`). Whether the result validates is `validate`'s to say.
    """
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    if any(decision.excludes for decision in decisions):
        _check_exclude_editable(lines, yamlsrc.loads("".join(lines), shown), shown)  # lines as the user has them
    added = []
    for decision in sorted(decisions, key=lambda item: Version(item.torch_xla)):
        doc = yamlsrc.loads("".join(lines), shown)
        releases = doc.data.get("releases") if isinstance(doc.data, dict) else None
        if not isinstance(releases, dict) or not releases:
            raise ConfigError("the matrix has no `releases` mapping to add to", location=Location(shown),
                              rule=RULE, hint="add the first release by hand (docs/matrix.md)")
        releases_line = doc.lines[("releases",)] - 1
        if lines[releases_line].split(":", 1)[1].strip().startswith("{"):
            raise ConfigError("releases is a flow mapping (`{...}`), so it cannot be edited in place",
                              location=Location(shown, releases_line + 1), rule=RULE,
                              hint="write one release block per version (as in the repository's matrix.yaml)")
        if decision.torch_xla in releases:
            continue
        lines = _add_release(lines, doc, releases, decision, shown)
        if decision.excludes:
            lines = _add_excludes(lines, yamlsrc.loads("".join(lines), shown), decision, shown)
        added.append(decision.torch_xla)
    return Edit("".join(lines), tuple(added))


def fill(text: str, shown: str, version: str, settings: list[tuple[str, str]]) -> str | None:
    """`text` with `settings` added at the end of release `version`'s block (every other line as it was); None
    when that release is written in flow style (`"2.9.0": {...}`), which is not edited in place."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    doc = yamlsrc.loads("".join(lines), shown)
    release = doc.data["releases"][version]
    key_line = doc.lines[("releases", version)] - 1
    if not isinstance(release, dict) or not release or \
            doc.lines[("releases", version, next(iter(release)))] - 1 == key_line:
        return None
    inner = _inner_indent(lines, doc, version, _indent(lines[key_line]))
    end = key_line + 1
    for index in range(key_line + 1, len(lines)):  # the block: its lines indented deeper than the release key
        if lines[index].strip() and not lines[index].startswith(inner):
            break
        if lines[index].strip() and not lines[index].lstrip().startswith("#"):
            end = index + 1
    return "".join(lines[:end] + [f"{inner}{key}: {value}\n" for key, value in settings] + lines[end:])


def _add_release(lines: list[str], doc: yamlsrc.YamlDoc, releases: dict, decision: Decision,
                 shown: str) -> list[str]:
    keys = list(releases)
    key_lines = [doc.lines[("releases", key)] - 1 for key in keys]
    indent = _indent(lines[key_lines[-1]])
    inner = _inner_indent(lines, doc, keys[-1], indent)
    block = [f'{indent}"{decision.torch_xla}":\n'] + [f"{inner}{key}: {value}\n" for key, value in decision.settings]
    newer = [index for index, key in enumerate(keys) if _newer(key, decision.torch_xla)]
    if newer:
        at = _with_leading_comments(lines, key_lines[newer[0]], indent)
    else:
        at = _block_end(lines, doc.lines[("releases",)] - 1)
    return lines[:at] + block + lines[at:]


def _add_excludes(lines: list[str], doc: yamlsrc.YamlDoc, decision: Decision, shown: str) -> list[str]:
    entries = doc.data.get("exclude")
    if "exclude" not in doc.data or entries is None:
        head = ["\n"] if lines and lines[-1].strip() else []
        return lines + head + ["exclude:\n"] + [line for comment, entry in decision.excludes
                                                for line in (f"  # {comment}\n", f"  - {entry}\n")]
    key_line = doc.lines[("exclude",)] - 1
    indent = _indent(lines[doc.lines[("exclude", 0)] - 1]) if entries else "  "
    at = _block_end(lines, key_line)
    added = [line for comment, entry in decision.excludes for line in (f"{indent}# {comment}\n",
                                                                      f"{indent}- {entry}\n")]
    return lines[:at] + added + lines[at:]


def _check_exclude_editable(lines: list[str], doc: yamlsrc.YamlDoc, shown: str) -> None:
    if not isinstance(doc.data, dict) or doc.data.get("exclude") is None:
        return
    entries = doc.data["exclude"]
    key_line = doc.lines[("exclude",)] - 1
    if not isinstance(entries, list) or lines[key_line].split(":", 1)[1].strip().startswith("["):
        raise ConfigError("exclude is not a block list (`- {...}` lines), so it cannot be edited in place",
                          location=Location(shown, key_line + 1), rule=RULE,
                          hint="write it as one `- {...}` line per entry, then run update again")


def _newer(key: str, version: str) -> bool:
    try:
        return Version(key) > Version(version)
    except ValueError:
        return False


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" "))]


def _inner_indent(lines: list[str], doc: yamlsrc.YamlDoc, key: str, indent: str) -> str:
    settings = doc.data["releases"][key]
    if isinstance(settings, dict) and settings:
        line = doc.lines[("releases", key, next(iter(settings)))]
        if line != doc.lines[("releases", key)]:  # a block mapping, not `"2.9.0": {torch: ...}`
            return _indent(lines[line - 1])
    return indent + "  "


def _block_end(lines: list[str], key_line: int) -> int:
    """The index after the last indented line of the top-level block that starts at `key_line`.

    Comments and blank lines between the block and the next top-level key belong to that key, not the block.
    """
    end = key_line + 1
    for index in range(key_line + 1, len(lines)):
        line = lines[index]
        if line.strip() and not line[0].isspace() and not line.startswith("#"):
            break
        if line.strip() and line[0].isspace():
            end = index + 1
    return end


def _with_leading_comments(lines: list[str], key_line: int, indent: str) -> int:
    """Where a block goes before the release at `key_line`: above the comment lines that introduce it."""
    at = key_line
    while at > 0 and lines[at - 1].startswith(indent + "#"):
        at -= 1
    return at


def validate(text: str, shown: str, site: Site, cache: wheel_index.WheelIndex | None) -> None:
    """What `validate` checks, on the edited text: the matrix rules, the site's, and wheel-python."""
    check_wheels(bind(matrix.expand(yamlsrc.loads(text, shown)), site), cache)


def diff(before: str, after: str, shown: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{shown}", tofile=f"b/{shown}"))
