"""lint: the committed renders are clean under hadolint and shellcheck, and real problems are found."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.errors import Failure
from xla_images.generate import render, sync
from xla_images.run.checking import lint

ROOT = Path(__file__).resolve().parents[2]

# Missing tools skip these tests on a developer's machine only; CI must have them (ci installs shellcheck).
needs_shellcheck = pytest.mark.skipif(
    shutil.which("shellcheck") is None and not lint.SHELLCHECK_DEFAULT.is_file() and not os.environ.get("CI"),
    reason="shellcheck is not installed (apt-get install shellcheck)")


def committed_renders() -> dict[str, str]:
    """The committed Dockerfiles, wheel-build parameter files and the static wheel-build script and builder."""
    paths = [path for path in sorted((ROOT / "Dockerfiles").glob("*/*")) if path.name in render.TEMPLATES]
    paths += sorted((ROOT / "wheel-builds").glob("*.env"))
    paths += [ROOT / relative for relative in sync.WHEEL_BUILD_STATIC]
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in paths}


@needs_shellcheck
def test_committed_renders_are_lint_clean() -> None:
    files = committed_renders()
    assert len([path for path in files if path.endswith("/Dockerfile")]) >= 20, "render first: ./build.py render"
    assert len([path for path in files if path.endswith(".env")]) >= 10
    findings = lint.lint_files(files)
    assert findings == [], "\n".join(map(str, findings))


@needs_shellcheck
def test_lint_targets_cover_the_wheel_build_files() -> None:
    from xla_images.generate.plan import load_plan

    targets = sync.lint_targets(load_plan(ROOT / "matrix.yaml"))
    assert set(sync.WHEEL_BUILD_STATIC) <= set(targets)
    assert {path for path in targets if path.endswith(".env")} == {
        path for path in committed_renders() if path.endswith(".env")}


@needs_shellcheck
def test_lint_finds_real_problems_and_names_file_and_line() -> None:
    files = {
        "Dockerfiles/bad/Dockerfile": "FROM debian:bookworm\nRUN apt-get update && apt-get install -y curl\n",
        "Dockerfiles/bad/build-wheels.sh": "#!/usr/bin/env bash\nrm -rf $1/build\n",
        "wheel-builds/bad.env": "# shellcheck shell=bash\nABI = cxx11\n",
    }
    findings = lint.lint_files(files)
    codes = {(finding.path, finding.code) for finding in findings}
    assert ("Dockerfiles/bad/Dockerfile", "DL3008") in codes  # unpinned apt package
    assert ("Dockerfiles/bad/build-wheels.sh", "SC2086") in codes  # unquoted expansion
    unquoted = next(finding for finding in findings if finding.code == "SC2086")
    assert unquoted.line == 2 and str(unquoted).startswith("Dockerfiles/bad/build-wheels.sh:2:")
    assert ("wheel-builds/bad.env", "SC2283") in codes  # a parameter file is shell: no spaces around =


def test_missing_shellcheck_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lint, "SHELLCHECK_DEFAULT", tmp_path / "no-shellcheck")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Failure) as caught:
        lint.find_shellcheck()
    assert caught.value.hint == "apt-get install shellcheck"


def test_hadolint_is_found_beside_this_python() -> None:
    assert lint.find_hadolint() == Path(sys.executable).parent / "hadolint"


def test_a_broken_linter_is_a_failure_not_a_pass(tmp_path: Path) -> None:
    def crashing(command, **kwargs):
        return subprocess.CompletedProcess(command, 3, stdout="", stderr="segfault")

    with pytest.raises(Failure) as caught:
        lint.lint_files({"Dockerfiles/x/Dockerfile": "FROM scratch\n"}, runner=crashing)
    assert "exit 3" in caught.value.message
