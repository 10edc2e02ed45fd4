"""Running the real CLI on hostile input, and judging the answer.

The promise every command keeps, whatever arrives: exit 0, or exit 2 with `file[:line]: error [rule]` on
stderr; never a traceback. `run_cli` runs `xla_images.cli.main` in-process (fast enough for a fuzz);
`run_limited` runs build.py in a subprocess under an address-space and CPU-time limit, which proves memory
and time are bounded (a bomb that were built would hit the limit and die, not answer).
"""
from __future__ import annotations

import re
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from xla_images.cli import main

ROOT = Path(__file__).resolve().parents[2]
# A frozen matrix (today's, at the time it was copied) and one of its locks: hostile inputs are edits of a
# realistic text, and must not change when the committed matrix gains or loses a release.
FIXTURE_MATRIX = ROOT / "tests" / "fixtures" / "matrix" / "matrix.yaml"
FIXTURE_LOCK = ROOT / "tests" / "fixtures" / "matrix" / "r2.9.0_3.11_cpu.requirements.lock"
# `path[:line[:column]]: error [rule]: message` -- the first line of every rendered error (a Failure about no
# file, such as "nothing matches", has no location).
ERROR_LINE = re.compile(r"^(?:(?P<location>.+?): )?error \[(?P<rule>[a-z0-9-]+)\]: \S", re.MULTILINE)
LOCATED = re.compile(r":(?P<line>\d+)(:\d+)?$")
# Rules about the file as a whole (it is a directory, too big, ...): these need no line.
WHOLE_FILE_RULES = {"file-exists", "file-readable", "file-type", "file-size", "yaml-size", "disk-symlink", "disk-type",
                    "disk-outside"}
MEMORY_LIMIT = 1024 * 1024 * 1024  # address space of a limited run; importing the CLI takes ~250 MB of it
CPU_LIMIT = 20  # seconds of CPU time; a bounded answer needs well under one
ANSWER_SECONDS = 60  # wall time an in-process command may take before it counts as hanging (answers take < 1 s)


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def rules(self) -> list[str]:
        return [match.group("rule") for match in ERROR_LINE.finditer(self.err)]


class NoAnswer(Exception):
    """The command did not answer within ANSWER_SECONDS: a hang (a fifo opened, /dev/zero read...)."""


def _no_answer(signum: int, frame: object) -> None:
    raise NoAnswer(f"no answer within {ANSWER_SECONDS} s")


def run_cli(*args: str) -> Outcome:
    """`build.py ARGS` in this process, through main() and its error handling, with captured streams.

    A hang fails the test after ANSWER_SECONDS (an alarm, not a wall-clock deadline per example: a loaded CI
    machine makes answers slower, never a passing case failing)."""
    runner = CliRunner()
    code = 0
    previous = signal.signal(signal.SIGALRM, _no_answer)
    signal.alarm(ANSWER_SECONDS)
    try:
        with runner.isolation() as (out, err, _):
            try:
                main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace"))


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT))


def run_limited(*args: str, cwd: Path = ROOT, timeout: float = 60) -> Outcome:
    """`build.py ARGS` in a subprocess that may use at most MEMORY_LIMIT bytes and CPU_LIMIT CPU seconds."""
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, preexec_fn=_limits, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return Outcome(result.returncode, result.stdout, result.stderr)


def assert_answered(outcome: Outcome, *, allowed_failures: frozenset[str] = frozenset()) -> None:
    """Exit 0; or exit 2 naming file, line (unless about the whole file) and rule; never a traceback.

    `allowed_failures`: rules of an exit-1 Failure that are a legitimate answer for this command (e.g.
    resolve finding no match), as long as they too are named.
    """
    assert "Traceback" not in outcome.err, outcome.err[-3000:]
    if outcome.code == 0:
        return
    errors = list(ERROR_LINE.finditer(outcome.err))
    assert errors, f"exit {outcome.code} without a located, named error:\n{outcome.err[-2000:]}"
    if outcome.code == 1:
        assert {match.group("rule") for match in errors} <= allowed_failures, outcome.err[-2000:]
        return
    assert outcome.code == 2, f"exit {outcome.code}:\n{outcome.err[-2000:]}"
    for match in errors:
        assert match.group("location"), f"no file named in: {match.group(0)}"
        # A command-line value (--set KEY=VALUE) has no lines to name.
        if match.group("rule") not in WHOLE_FILE_RULES and not match.group("location").startswith("--set "):
            assert LOCATED.search(match.group("location")), f"no line in: {match.group(0)}"


# --- the corpus: hostile matrices and site files (test_hostile_inputs.py runs them through the CLI,
# test_schemas.py holds the JSON Schemas to the validator's verdicts on them) --------------------------------

MATRIX = FIXTURE_MATRIX.read_text(encoding="utf-8")
# "Billion laughs": nine levels of nine aliases, 9**9 values if it were built.
BOMB = "".join(f"{name}: &{name} [{', '.join([item] * 9)}]\n"
               for item, name in zip(['"lol"', *(f"*{prev}" for prev in "abcdefgh")], "abcdefghi"))


def edit(old: str, new: str) -> str:
    assert old in MATRIX, old
    return MATRIX.replace(old, new, 1)


def line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


# (case id, matrix text, rule, text on the line the error must name (None: line 1 / whole file))
MATRIX_CASES = [
    ("empty-file", "", "schema-missing", None),
    ("list-at-top", "- schema\n- 1\n", "schema-type", None),
    ("null-everywhere", "schema: ~\ndefaults: ~\nreleases: ~\nexclude: ~\n", "schema-type", "defaults: ~"),
    ("schema-float", edit("schema: 1", "schema: 1.0"), "schema-type", "schema: 1.0"),
    ("schema-bool", edit("schema: 1", "schema: true"), "schema-type", "schema: true"),
    ("schema-string", edit("schema: 1", 'schema: "1"'), "schema-type", 'schema: "1"'),
    ("schema-2", edit("schema: 1", "schema: 2"), "schema-version", "schema: 2"),
    ("alias-bomb", BOMB, "yaml-aliases", "e: &e"),  # 9**5 values pass the limit: refused there
    ("self-alias", "schema: 1\nreleases: &r\n  x: *r\n", "yaml-aliases", "x: *r"),
    ("deep-sequence", "schema: " + "[" * 5000 + "]" * 5000 + "\n", "yaml-depth", None),
    ("deep-mapping", "".join("  " * i + f"k{i}:\n" for i in range(200)), "yaml-depth", "k31:"),
    ("deep-by-alias", "a: &a [[[[[[[[[[1]]]]]]]]]]\nb: &b [*a, [[[[[[[[[[*a]]]]]]]]]]]\n"
                      "c: &c [*b, [[[[[[[[[[*b]]]]]]]]]]]\nd: [*c, [[[[[[[[[[*c]]]]]]]]]]]\n", "yaml-depth", "c:"),
    ("python-tag", "schema: !!python/object/apply:os.system [ls]\n", "yaml-tag", "schema"),
    ("custom-tag", edit('torch: "2.9.0"', "torch: !version 2.9.0"), "yaml-tag", "torch: !version"),
    ("long-tag", "schema: !" + "t" * 100_000 + " 1\n", "yaml-tag", None),
    ("binary-tag", "schema: !!binary aGVsbG8=\n", "yaml-tag", None),
    ("set-tag", "releases: !!set {a, b}\n", "yaml-tag", None),
    ("duplicate-key", MATRIX + "exclude: []\n", "yaml-duplicate-key", "exclude: []"),
    ("default-abi-not-built", edit("  default_abi: cxx11\n", "  default_abi: pre-cxx11\n"), "abi-default",
     "  default_abi: pre-cxx11"),
    ("release-default-abi-not-built",
     edit('    libtpu: "0.0.21"\n', '    libtpu: "0.0.21"\n    default_abi: pre-cxx11  # not built\n'),
     "abi-default", "# not built"),
    ("latest-python-not-built", edit('latest_python: "3.11"', 'latest_python: "3.8"'), "latest-python",
     'latest_python: "3.8"'),
    ("python-twice", edit('"3.9", "3.10"', '"3.9", "3.9"'), "schema-duplicate", "pythons: [\"3.9\", \"3.9\""),
    ("accelerator-twice", edit("accelerators: [tpu, cpu]", "accelerators: [tpu, tpu]"), "schema-duplicate",
     "accelerators: [tpu, tpu]"),
    ("bool-python", edit('"3.9", "3.10"', 'yes, "3.10"'), "schema-type", 'yes, "3.10"'),
    ("nan-python", edit('latest_python: "3.11"', "latest_python: .nan"), "version-format", "latest_python"),
    ("inf-torch", edit('torch: "2.9.0"', "torch: .inf"), "version-format", "torch: .inf"),
    ("octal-libtpu", edit('libtpu: "0.0.21"', "libtpu: 010"), "version-format", "libtpu: 010"),
    ("date-libtpu", edit('libtpu: "0.0.21"', "libtpu: 2024-01-01"), "schema-type", "libtpu: 2024"),
    ("impossible-date", edit('libtpu: "0.0.21"', "libtpu: 2024-13-45"), "yaml-value", "libtpu: 2024"),
    ("huge-int", edit('torch: "2.9.0"', "torch: " + "1" * 5000), "yaml-value", "torch: 111"),
    ("unicode-digits", edit('"2.9.0":\n', '"\u0662.\u0669.\u0660":\n'), "version-format", '"\u0662.'),
    ("unicode-digits-everywhere",  # \d matched them, then Version() raised a traceback
     edit('"2.9.0":\n    torch: "2.9.0"', '"\u0662.\u0669.\u0660":\n    torch: "\u0662.\u0669.\u0660"'),
     "version-format", 'torch: "\u0662'),
    ("newline-in-key", edit('"2.9.0":\n', '"2.9.0\\n":\n'), "version-format", '"2.9.0\\n"'),
    ("newline-in-torch", edit('torch: "2.9.0"', 'torch: "2.9.0\\n"'), "version-format", 'torch: "2.9.0\\n"'),
    ("shell-in-git-rev", edit("pytorch_git_rev: v2.9.1", "pytorch_git_rev: 'v2.9.1; curl x|sh'"), "git-rev",
     "pytorch_git_rev: 'v2.9.1;"),
    ("huge-git-rev", edit("pytorch_git_rev: v2.9.1", "pytorch_git_rev: " + "a" * 200_000), "git-rev",
     "pytorch_git_rev: aaa"),
    ("list-in-exclude", edit('{python: "3.9", accelerator: cpu}', '{python: ["3.9"], accelerator: cpu}'),
     "schema-type", '{python: ["3.9"]'),
    ("thousands-of-flavours", edit('["3.9", "3.10", "3.11", "3.12", "3.13"]',
                                   "[" + ", ".join(f'"3.{minor}"' for minor in range(9, 999)) + "]")
     .replace('python_support: ">=3.10,<3.14"', 'python_support: ">=3.10"'), "matrix-size", "releases:"),
    ("merge-key", "a: &a {x: 1}\nb:\n  <<: *a\n", "yaml-key", "<<"),
    ("complex-key", "? [a, b]\n: 1\n", "yaml-key", None),
    ("two-documents", MATRIX + "---\nschema: 1\n", "yaml-syntax", "---"),
    ("control-character", "schema: 1\x07\n", "yaml-syntax", None),
    # canonical equality (issue 19): 3.010 is 3.10 and 02.9.0 is 2.9.0 -- never a second flavour beside it
    ("python-leading-zero", edit('"3.9", "3.10"', '"3.9", "3.010"'), "version-format", '"3.010"'),
    ("python-leading-zero-unquoted", edit('"3.9", "3.10"', '"3.9", 3.010'), "version-format", "3.010"),
    ("release-leading-zero", edit('"2.9.0":\n', '"02.9.0":\n'), "version-format", '"02.9.0"'),
    ("torch-leading-zero", edit('torch: "2.9.0"', 'torch: "2.09.0"'), "version-format", 'torch: "2.09.0"'),
    # companions (issue 33): known names, each with its recorded version, only where the index's builds fit
    ("unknown-companion", edit('    libtpu: "0.0.21"\n', '    libtpu: "0.0.21"\n    torchvision: "0.24.0"\n'
                                                          '    companions: [torchvison]\n'), "companion-name",
     "companions: [torchvison]"),
    ("companion-not-a-list", edit('    libtpu: "0.0.21"\n', '    libtpu: "0.0.21"\n    companions: torchaudio\n'),
     "schema-type", "companions: torchaudio"),
    ("companion-without-version",
     edit('    libtpu: "0.0.21"\n', '    libtpu: "0.0.21"\n    companions: [torchaudio]\n'), "companion-version",
     "companions: [torchaudio]"),
    ("companion-in-two-abis", edit('    libtpu: "0.0.7.1"\n', '    libtpu: "0.0.7.1"\n    torchvision: "0.21.0"\n'
                                                           '    companions: [torchvision]\n'), "companion-abi",
     "companions: [torchvision]"),
    ("companion-version-word", edit('    libtpu: "0.0.21"\n', '    libtpu: "0.0.21"\n    torchvision: latest\n'),
     "version-format", "torchvision: latest"),
    # issue 41: numbers bounded before they are converted (0x + 4000 digits: Python's int limit, a traceback),
    # git revisions by git's ref-name rules (a path out of the tree landed quoted in wheel-builds/*.env)
    ("huge-hex-schema", edit("schema: 1", "schema: 0x" + "f" * 4000), "yaml-value", "schema: 0x"),
    ("huge-decimal-in-exclude", edit('{python: "3.9", accelerator: cpu}', "{python: " + "9" * 5000 +
                                     ", accelerator: cpu}"), "yaml-value", "{python: 999"),
    ("git-rev-dot-dot", edit("pytorch_git_rev: v2.9.1", "pytorch_git_rev: v2.9.1/../../../../etc/passwd"),
     "git-rev", "pytorch_git_rev: v2.9.1/.."),
    ("git-rev-lock", edit("pytorch_git_rev: v2.9.1", "pytorch_git_rev: v2.9.1.lock"), "git-rev",
     "pytorch_git_rev: v2.9.1.lock"),
    ("git-rev-trailing-slash", edit("pytorch_git_rev: v2.9.1", "pytorch_git_rev: release/"), "git-rev",
     "pytorch_git_rev: release/"),
]



# What strictness must not break: unquoted pythons, a BOM, CRLF line ends, float-looking exclude values (the
# validator accepts each, and so must the matrix's JSON Schema).
MATRICES_AS_WRITTEN = {
    "unquoted": edit('["3.9", "3.10", "3.11", "3.12", "3.13"]', "[3.9, 3.10, 3.11, 3.12, 3.13]"),
    "bom": "\ufeff" + MATRIX, "crlf": MATRIX.replace("\n", "\r\n"),
    "float-exclude": edit('{python: "3.9", accelerator: cpu}', "{python: 3.9, accelerator: cpu}"),
}


SITE_CASES = [
    ("newline-in-base", 'bases: {"3.11": "python:3.11\\nRUN curl x | sh"}\n', "site-bases", "bases"),
    ("base-key-not-python", "bases: {latest: python:3.11}\n", "site-bases", "bases"),
    ("source-name-with-space", "wheel_sources:\n  - name: a b\n", "site-wheel-sources", "name: a b"),
    ("index-url-not-http", "wheel_sources:\n  - name: a\n    index_url: 'ftp://x\n      y'\n", "site-wheel-sources",
     "index_url"),
    ("local-label-without-plus", "wheel_sources:\n  - name: a\n    torch_local: cxx11\n", "site-wheel-sources",
     "torch_local"),
    ("float-specifier", "wheel_sources:\n  - name: a\n    match: {torch_xla: 2.7}\n", "site-wheel-sources", "match"),
    ("find-links-mapping", "wheel_sources:\n  - name: a\n    find_links: [{x: 1}]\n", "site-wheel-sources",
     "find_links"),
    ("two-sources-one-name", "wheel_sources:\n  - name: a\n  - name: a  # again\n", "site-wheel-sources", "again"),
    ("nul-in-ca-bundle", 'ca_bundle: "a\\0b"\n', "site-ca-bundle", "ca_bundle"),
    ("space-in-registry", "registry: host/ repo\n", "site-registry", "registry"),
    # registry hosts as Docker reads them (issue 19)
    ("registry-port-too-big", "registry: 127.0.0.1:65536/x\n", "site-registry", "registry"),
    ("registry-dot-dot", "registry: a..b:5000/x\n", "site-registry", "registry"),
    ("registry-leading-hyphen", "registry: -a.example/x\n", "site-registry", "registry"),
    # issue 41: hosts by RFC 1123 (labels of 1-63, 253 in all), bases by Docker's reference grammar
    ("registry-label-too-long", "registry: " + "a" * 64 + ".example:5000/x\n", "site-registry", "registry"),
    ("mirror-host-too-long", "pull_mirror: " + ".".join(["a" * 60] * 20) + "\n", "site-pull-mirror",
     "pull_mirror"),
    ("shell-in-base", 'bases: {"3.11": "python:3.11;curl${IFS}x|sh"}\n', "site-bases", "bases"),
    ("base-tag-too-long", 'bases: {"3.11": "python:' + "t" * 129 + '"}\n', "site-bases", "bases"),
    ("base-uppercase-path", 'bases: {"3.11": "Python:3.11"}\n', "site-bases", "bases"),
    # refused, not cut at 200 characters (a cut specifier matches other releases)
    ("long-specifier", "wheel_sources:\n  - name: a\n    match: {torch_xla: '" + ">=2.7," * 40 + "<3'}\n",
     "site-wheel-sources", "name: a"),
    ("site-bomb", BOMB.replace("a: &a", "bases: &a"), "yaml-aliases", "e: &e"),
    ("site-list", "- registry\n", "site-schema", None),
    # YAML 1.1 integers not written in decimal: refused, not read as 3 (or as an int nobody can print)
    ("hex-level", "compression:\n  format: zstd\n  level: 0x3\n", "site-number", "level"),
    ("huge-hex-level", "compression:\n  level: 0x" + "f" * 4000 + "\n", "yaml-value", "level"),
    ("binary-level", "compression: {format: zstd, level: 0b11}\n", "site-number", "compression"),
    ("base-60-level", "compression:\n  level: 3:00\n", "site-number", "level"),
]
