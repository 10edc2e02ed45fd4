"""`render` writes, `render --check` finds drift: missing, stale, orphan files and missing or stale locks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from golden import two_releases
from xla_images import names
from xla_images.generate import sync
from xla_images.generate.plan import Plan, load_plan
from xla_images.model import lockfile

ROOT = Path(__file__).resolve().parents[2]

MATRIX = two_releases(('pythons: ["3.10", "3.11", "3.12"]', 'pythons: ["3.11"]'),
                      ('    libtpu: "0.0.7.1"\n', '    accelerators: [cpu]\n'))
# r2.6.0_3.11_cpu (default index), r2.6.0_3.11_cpu_cxx11 (wheelhouse source), r2.9.0_3.11_tpuvm, r2.9.0_3.11_cpu
WHEELHOUSE_TAG = "r2.6.0_3.11_cpu_cxx11"


def project(tmp_path: Path, matrix: str = MATRIX) -> Plan:
    (tmp_path / "matrix.yaml").write_text(matrix)
    return load_plan(tmp_path / "matrix.yaml")


def reload(plan: Plan) -> Plan:
    return load_plan(plan.matrix_path)


def fake_lock(plan: Plan, tag: str) -> Path:
    """A lock with the right inputs hash (its pins are made up: this tests the drift check, not resolution)."""
    flavour = next(flavour for flavour in plan.flavours if flavour.tag == tag)
    inputs = lockfile.lock_inputs(flavour, lockfile.group_requirements(plan.flavours, flavour))
    entries = [lockfile.LockEntry("torch", flavour.torch, "a" * 64, f"torch-{flavour.torch}-cp311-cp311-x.whl")]
    path = plan.lock_path(flavour)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(lockfile.format_lock(flavour, inputs, entries))
    return path


def kinds(findings: list[sync.Finding]) -> dict[str, str]:
    return {finding.path: finding.kind for finding in findings}


def test_fresh_checkout_reports_every_file_missing(tmp_path: Path) -> None:
    plan = project(tmp_path)
    found = kinds(sync.check(plan))
    for flavour in plan.flavours:
        assert found[f"Dockerfiles/{flavour.tag}/Dockerfile"] == "missing"
        assert found[flavour.wheel_build.params_path] == "missing"
    # The cpu and tpu flavours of 2.9 / 3.11 share one wheel build: three builds for four flavours.
    assert sorted(path for path in found if path.startswith("wheel-builds/")) == [
        "wheel-builds/r2.6.0_3.11_cxx11.env", "wheel-builds/r2.6.0_3.11_precxx11.env",
        "wheel-builds/r2.9.0_3.11_cxx11.env"]
    expected_ci = [str(path) for path in sync.expected_files(plan) if not str(path).startswith("Dockerfiles/")]
    assert expected_ci, "the CI generator's files are part of what render owns"
    for path in expected_ci:
        assert found[path] == "missing"


def test_after_render_only_locks_remain(tmp_path: Path) -> None:
    plan = project(tmp_path)
    result = sync.write(plan)
    assert len(result.written) == len(sync.expected_files(plan))
    assert sync.write(plan).written == ()  # idempotent
    findings = sync.check(plan)
    assert {finding.path for finding in findings} == {
        f"Dockerfiles/{flavour.tag}/requirements.lock" for flavour in plan.flavours}
    by_path = {finding.path: finding for finding in findings}
    unlocked = by_path[f"Dockerfiles/{WHEELHOUSE_TAG}/requirements.lock"]
    assert unlocked.kind == "unlocked" and unlocked.warning and "wheels not available here" in unlocked.message
    assert all(finding.kind == "missing" and not finding.warning
               for path, finding in by_path.items() if WHEELHOUSE_TAG not in path)


def test_stale_and_missing_rendered_files_are_named(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    dockerfile = tmp_path / "Dockerfiles" / "r2.9.0_3.11_cpu" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("PJRT_DEVICE", "PJRT_DEVICES"))
    parameters = tmp_path / "wheel-builds" / "r2.9.0_3.11_cxx11.env"
    parameters.write_text(parameters.read_text().replace("XLA_REV=v2.9.0", "XLA_REV=v2.9.1"))
    (tmp_path / "Dockerfiles" / "r2.6.0_3.11_cpu" / "Dockerfile").unlink()
    (tmp_path / "wheel-builds" / "r2.6.0_3.11_cxx11.env").unlink()
    found = {finding.path: finding for finding in sync.check(plan)}
    assert found["Dockerfiles/r2.9.0_3.11_cpu/Dockerfile"].kind == "stale"
    assert found["wheel-builds/r2.9.0_3.11_cxx11.env"].kind == "stale"
    assert found["Dockerfiles/r2.6.0_3.11_cpu/Dockerfile"].kind == "missing"
    assert found["wheel-builds/r2.6.0_3.11_cxx11.env"].kind == "missing"
    sync.write(plan)
    assert not [finding for finding in sync.check(plan) if not finding.path.endswith(".lock")]


def test_orphans_are_found_and_only_generated_ones_removed(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    gone = tmp_path / "Dockerfiles" / "r2.8.1_3.11_cpu"
    gone.mkdir()
    (gone / "Dockerfile").write_text(plan.rendered["r2.9.0_3.11_cpu"]["Dockerfile"])
    kept = tmp_path / "Dockerfiles" / "r2.7.0_3.11_cpu"
    kept.mkdir()
    (kept / "notes.txt").write_text("my own notes\n")
    stray = tmp_path / "Dockerfiles" / "r2.9.0_3.11_cpu" / "Dockerfile.orig"
    stray.write_text("a merge leftover\n")
    found = kinds(sync.check(plan))
    assert found["Dockerfiles/r2.8.1_3.11_cpu"] == "orphan"
    assert found["Dockerfiles/r2.7.0_3.11_cpu"] == "orphan"
    assert found["Dockerfiles/r2.9.0_3.11_cpu/Dockerfile.orig"] == "orphan"
    result = sync.write(plan)
    assert result.removed == ("Dockerfiles/r2.8.1_3.11_cpu",) and not gone.exists()
    assert result.kept_orphans == ("Dockerfiles/r2.7.0_3.11_cpu",) and (kept / "notes.txt").exists()


def test_wheel_build_orphans_are_found_and_only_generated_ones_removed(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    folder = tmp_path / "wheel-builds"
    for static in ("build-wheels.sh", "Dockerfile"):  # the committed files are not orphans
        (folder / static).write_text("# committed, not generated\n")
    gone = folder / "r2.8.1_3.11_cxx11.env"
    gone.write_text((folder / "r2.9.0_3.11_cxx11.env").read_text())
    mine = folder / "notes.txt"
    mine.write_text("my own notes\n")
    found = {finding.path: finding for finding in sync.check(plan) if finding.kind == "orphan"}
    assert set(found) == {"wheel-builds/r2.8.1_3.11_cxx11.env", "wheel-builds/notes.txt"}
    assert "no flavour of the matrix uses this wheel build" in found["wheel-builds/r2.8.1_3.11_cxx11.env"].message
    result = sync.write(plan)
    assert result.removed == ("wheel-builds/r2.8.1_3.11_cxx11.env",) and not gone.exists()
    assert mine.exists() and (folder / "build-wheels.sh").exists()


def test_a_release_dropped_from_the_matrix_orphans_its_wheel_builds(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    only_29 = MATRIX[:MATRIX.index('  "2.6.0":')] + MATRIX[MATRIX.index('  "2.9.0":'):]
    smaller = project(tmp_path, only_29)
    orphans = {finding.path for finding in sync.check(smaller) if finding.kind == "orphan"}
    assert {"wheel-builds/r2.6.0_3.11_cxx11.env", "wheel-builds/r2.6.0_3.11_precxx11.env"} <= orphans
    assert set(sync.write(smaller).removed) >= {"wheel-builds/r2.6.0_3.11_cxx11.env",
                                                  "wheel-builds/r2.6.0_3.11_precxx11.env"}
    assert sorted(path.name for path in (tmp_path / "wheel-builds").iterdir()) == ["r2.9.0_3.11_cxx11.env"]


def test_flavour_dropped_from_the_matrix_becomes_an_orphan(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    fake_lock(plan, "r2.9.0_3.11_tpuvm")
    smaller = project(tmp_path, MATRIX.replace("    libtpu: \"0.0.21\"\n", "    accelerators: [cpu]\n"))
    assert kinds(sync.check(smaller))["Dockerfiles/r2.9.0_3.11_tpuvm"] == "orphan"
    # Its lock is generated too (it carries the header), so the whole folder goes.
    assert sync.write(smaller).removed == ("Dockerfiles/r2.9.0_3.11_tpuvm",)


def test_lock_states(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    status = {flavour.tag: lockfile.lock_status(plan, flavour).state for flavour in plan.flavours}
    assert status == {"r2.6.0_3.11_cpu": lockfile.LockState.MISSING,
                      WHEELHOUSE_TAG: lockfile.LockState.UNAVAILABLE,
                      "r2.9.0_3.11_tpuvm": lockfile.LockState.MISSING,
                      "r2.9.0_3.11_cpu": lockfile.LockState.MISSING}
    for tag in ("r2.6.0_3.11_cpu", "r2.9.0_3.11_tpuvm", "r2.9.0_3.11_cpu"):
        fake_lock(plan, tag)
    assert [finding for finding in sync.check(plan) if not finding.warning] == []
    # Once the wheelhouse exists, the missing lock is drift.
    (tmp_path / "wheelhouse" / "built").mkdir(parents=True)
    assert kinds(sync.check(plan))[f"Dockerfiles/{WHEELHOUSE_TAG}/requirements.lock"] == "missing"


def test_lock_goes_stale_when_its_inputs_change(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    for tag in ("r2.6.0_3.11_cpu", "r2.9.0_3.11_tpuvm", "r2.9.0_3.11_cpu"):
        fake_lock(plan, tag)
    changed = project(tmp_path, MATRIX.replace('libtpu: "0.0.21"', 'libtpu: "0.0.21.1"'))
    sync.write(changed)
    stale = {finding.path for finding in sync.check(changed) if finding.kind == "stale"}
    # The tpu flavour's pins changed, and so did the union its cpu sibling was resolved with.
    assert stale == {"Dockerfiles/r2.9.0_3.11_tpuvm/requirements.lock",
                     "Dockerfiles/r2.9.0_3.11_cpu/requirements.lock"}
    other_site = load_plan(plan.matrix_path, overrides=(
        'wheel_sources=[{name: mirror, index_url: "https://mirror.invalid/simple"}]',))
    stale = {finding.path for finding in sync.check(other_site) if finding.kind == "stale"}
    assert stale == {f"Dockerfiles/{tag}/requirements.lock"
                     for tag in ("r2.6.0_3.11_cpu", "r2.9.0_3.11_tpuvm", "r2.9.0_3.11_cpu")}


def test_unreadable_lock_is_stale(tmp_path: Path) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    path = fake_lock(plan, "r2.9.0_3.11_cpu")
    path.write_text(path.read_text() + "torch>=2\n")
    found = {finding.path: finding for finding in sync.check(plan)}
    finding = found["Dockerfiles/r2.9.0_3.11_cpu/requirements.lock"]
    assert finding.kind == "stale" and "not a lock line" in finding.message


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_render_check_exit_codes(tmp_path: Path) -> None:
    plan = project(tmp_path)
    matrix = str(plan.matrix_path)
    result = run_cli("render", "--check", "--matrix", matrix)
    assert result.returncode == 1
    assert "Dockerfiles/r2.9.0_3.11_cpu/Dockerfile: drift [missing]" in result.stderr
    assert "render-drift" in result.stderr and "Traceback" not in result.stderr
    assert run_cli("render", "--matrix", matrix).returncode == 0
    for tag in ("r2.6.0_3.11_cpu", "r2.9.0_3.11_tpuvm", "r2.9.0_3.11_cpu"):
        fake_lock(reload(plan), tag)
    # The constraints file (and the Dockerfile's label of its sha256) is made from the lock: a lock written by
    # hand leaves it stale (`lock` renders it with the lock).
    result = run_cli("render", "--check", "--offline", "--matrix", matrix)
    assert result.returncode == 1 and "Dockerfiles/r2.9.0_3.11_cpu/constraints.txt: drift [stale]" in result.stderr
    assert run_cli("render", "--matrix", matrix).returncode == 0
    # Fake locks name wheels no index has: the layout is not checkable, and --offline says so without asking.
    result = run_cli("render", "--check", "--offline", "--matrix", matrix)
    assert result.returncode == 0, result.stderr
    assert "layout not checked (offline, wheels not cached)" in result.stderr
    assert f"Dockerfiles/{WHEELHOUSE_TAG}/requirements.lock: warning [unlocked]" in result.stdout
    assert "up to date" in result.stdout


def test_committed_repository_renders_are_current() -> None:
    """The renders in this repository match the templates and matrix.yaml (what CI runs as render --check)."""
    plan = load_plan(ROOT / "matrix.yaml")
    drift = [str(finding) for finding in sync.check(plan)
             if not finding.warning and not finding.path.endswith(names.LOCK_NAME)
             and finding.path.startswith(("Dockerfiles/", "wheel-builds/"))]
    assert drift == []


@pytest.mark.parametrize("name", ["Dockerfile", "wheel-build", names.LOCK_NAME])
def test_generated_files_carry_the_mark(tmp_path: Path, name: str) -> None:
    plan = project(tmp_path)
    sync.write(plan)
    if name == names.LOCK_NAME:
        path = fake_lock(plan, "r2.9.0_3.11_cpu")
    elif name == "wheel-build":
        path = tmp_path / "wheel-builds" / "r2.9.0_3.11_cxx11.env"
    else:
        path = tmp_path / "Dockerfiles" / "r2.9.0_3.11_cpu" / name
    assert sync._is_generated(path)


@pytest.mark.parametrize("name", ["docker-bake.json", "Dockerfile"])
def test_a_file_larger_than_render_check_reads_is_refused_not_written(tmp_path: Path, name: str) -> None:
    """The limits agree: what `render` writes, `render --check` reads back (a 2.4 MB docker-bake.json of a
    large matrix was written, then refused by its own check, issue 35)."""
    from xla_images.errors import ConfigError

    limit = sync.size_limit(Path(name))
    for step in (sync.write_files, sync.drift):
        with pytest.raises(ConfigError) as caught:
            step(tmp_path, {Path(name): "x" * (limit + 1)})
        assert caught.value.rule == "render-size" and str(caught.value.location) == name
    assert not (tmp_path / name).exists()
    largest = {Path(name): "x" * limit}
    assert sync.write_files(tmp_path, largest) == [Path(name)]
    assert sync.drift(tmp_path, largest) == []


def test_the_bake_file_of_the_largest_matrix_validation_accepts_is_written_and_read() -> None:
    """docker-bake.json grows with the matrix: its bound holds MAX_FLAVOURS flavours of today's size, twice."""
    from xla_images.generate import cigen
    from xla_images.model.matrix import MAX_FLAVOURS

    plan = load_plan(ROOT / "tests" / "fixtures" / "matrix" / "matrix.yaml")
    text = cigen.bake_files(plan)[cigen.BAKE_FILE]
    per_flavour = len(text.encode()) / len(plan.flavours)
    assert 2 * per_flavour * MAX_FLAVOURS < sync.size_limit(cigen.BAKE_FILE)
    assert per_flavour * MAX_FLAVOURS > 1024 * 1024  # which the old bound, 1 MiB, could not
