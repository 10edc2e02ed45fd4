"""The generated CI files are committed: they must equal what the matrix renders, and drift must be caught."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.generate import cigen, sync
from xla_images.generate.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture()
def scratch(tmp_path: Path) -> Path:
    """A root with the repository's matrix and no CI files yet."""
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    return tmp_path


def test_committed_files_are_the_rendered_ones() -> None:
    """Golden check on the real matrix: what is committed is byte for byte what `ci github` / `ci bake` write."""
    files = cigen.generated_files(load_plan(ROOT / "matrix.yaml"))
    assert set(files) == {cigen.BUILD_WORKFLOW, cigen.RESOLVE_WORKFLOW, cigen.EXAMPLE_WORKFLOW, cigen.UPDATE_WORKFLOW,
                          cigen.BAKE_FILE}
    assert sync.drift(ROOT, files) == [], \
        "regenerate with `./build.py ci github && ./build.py ci bake`"


def test_commands_write_then_report_unchanged(scratch: Path) -> None:
    matrix = str(scratch / "matrix.yaml")
    first = run("ci", "github", "--matrix", matrix)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"wrote {p.as_posix()}" for p in
                                         (cigen.BUILD_WORKFLOW, cigen.RESOLVE_WORKFLOW, cigen.EXAMPLE_WORKFLOW,
                                          cigen.UPDATE_WORKFLOW)]
    again = run("ci", "github", "--matrix", matrix)
    assert all(line.startswith("unchanged ") for line in again.stdout.splitlines())
    bake = run("ci", "bake", "--matrix", matrix)
    assert bake.stdout.strip() == f"wrote {cigen.BAKE_FILE}"
    expected = cigen.generated_files(load_plan(scratch / "matrix.yaml"))
    for relative, text in expected.items():
        assert (scratch / relative).read_text() == text


@pytest.mark.parametrize("command, relative", [
    ("github", cigen.BUILD_WORKFLOW),
    ("github", cigen.EXAMPLE_WORKFLOW),
    ("bake", cigen.BAKE_FILE),
])
def test_check_detects_edits_and_deletions(scratch: Path, command: str, relative: Path) -> None:
    matrix = str(scratch / "matrix.yaml")
    assert run("ci", command, "--matrix", matrix).returncode == 0
    clean = run("ci", command, "--check", "--matrix", matrix)
    assert clean.returncode == 0, clean.stderr

    path = scratch / relative
    path.write_text(path.read_text().replace("r2.9", "r2.8", 1) + "\n")
    edited = run("ci", command, "--check", "--matrix", matrix)
    assert edited.returncode == 1
    assert f"{relative.as_posix()}: stale" in edited.stderr and "[ci-drift]" in edited.stderr
    assert "Traceback" not in edited.stderr

    path.unlink()
    deleted = run("ci", command, "--check", "--matrix", matrix)
    assert deleted.returncode == 1 and f"{relative.as_posix()}: missing" in deleted.stderr
    assert not path.exists()  # --check writes nothing


def test_matrix_change_makes_the_bake_file_stale(scratch: Path) -> None:
    """A change of matrix.yaml's flavours must show up as drift until `ci bake` is run again."""
    matrix = scratch / "matrix.yaml"
    assert run("ci", "bake", "--matrix", str(matrix)).returncode == 0
    text = matrix.read_text()
    # No flavour carries `latest` any more: the bake targets' tags change, whatever releases the matrix holds.
    matrix.write_text(re.sub(r"(?m)^  latest_python: .*$", "  latest_python: none", text, count=1))
    assert matrix.read_text() != text
    stale = run("ci", "bake", "--check", "--matrix", str(matrix))
    assert stale.returncode == 1 and "docker-bake.json: stale" in stale.stderr
    assert run("ci", "bake", "--matrix", str(matrix)).returncode == 0
    assert run("ci", "bake", "--check", "--matrix", str(matrix)).returncode == 0


def test_render_check_includes_the_ci_files(scratch: Path) -> None:
    """`render --check` (the RENDER helper's) imports cigen.generated_files and reports these paths too."""
    probe = run("render", "--help")
    if probe.returncode != 0 or "--check" not in probe.stdout:
        pytest.skip("`build.py render --check` is not available yet")
    matrix = str(scratch / "matrix.yaml")
    assert run("render", "--matrix", matrix).returncode == 0
    assert run("ci", "github", "--check", "--matrix", matrix).returncode == 0
    path = scratch / cigen.RESOLVE_WORKFLOW
    path.write_text(path.read_text() + "# hand edit\n")
    result = run("render", "--check", "--matrix", matrix)
    assert result.returncode == 1
    assert cigen.RESOLVE_WORKFLOW.as_posix() in result.stdout + result.stderr
