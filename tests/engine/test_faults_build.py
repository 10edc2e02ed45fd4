"""Faults around `build` and `test` with real processes: two builds of one flavour at once, a full disk where
reports and build contexts are written (a 2 MB tmpfs), and Ctrl-C during `build.py test`.

The projects are conftest.py's throw-away ones (tiny local torch/torch_xla wheels on the session's test base),
so a build takes seconds; their releases (8.9x) are versions no real matrix and no other test module has.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from xla_images import names
from xla_images.run.building import build_mutex
from xla_images.run import engine
from xla_images.model import published as model_published
from xla_images.run.shipping import publish

REPO = Path(__file__).resolve().parents[2]
SESSION_LABEL = "io.xla-images.test-session"  # conftest.py's: every container of a test image carries it
TMPFS_BYTES = 2 << 20
VERSION = "8.91.0"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "CI": "true", "PYTHONPATH": str(REPO), **extra}


def dangling_since(session_id: str) -> Callable[[], list[str]]:
    """Untagged childless images of this session that appear from now on (what a build must not leave)."""
    def now() -> set[str]:
        return {item["Id"] for item in engine.connection.api().images(
            filters={"dangling": True, "label": f"{SESSION_LABEL}={session_id}"})}

    before = now()
    return lambda: sorted(now() - before)


def session_containers(session_id: str) -> list[dict]:
    return engine.connection.api().containers(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"})


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _run(project, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(project.cli_command(*args), cwd=project.root, env=env or _env(), capture_output=True,
                          text=True, timeout=timeout)


def _popen(project, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    # A session of its own: a signal can go to the whole process group, as a terminal's Ctrl-C does.
    return subprocess.Popen(project.cli_command(*args), cwd=project.root, env=env or _env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(process: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


@pytest.fixture(scope="module")
def project(make_project):
    """One flavour built once for the module; its torch wheel (3 MB) is too big for the small tmpfs."""
    made = make_project(VERSION, payload=os.urandom(3 << 20))
    result = _run(made, "build", made.flavour(VERSION).tag)
    assert result.returncode == 0, result.stderr
    return made


def _untag(project) -> None:
    """Drop the flavour's names (the image goes, its cached steps stay): the next build is a cached one."""
    flavour = project.flavour(VERSION)
    for name in flavour.tags:
        engine.images.remove_tag(names.local_ref(name))
    assert project.image_id(VERSION) is None


# --- two builds of one flavour at once ---------------------------------------------------------------------

HOLD_LOCK = """
import sys
from pathlib import Path
from xla_images.run.building import build_mutex
with build_mutex.exclusive([sys.argv[1]], directory=Path(sys.argv[2])):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def test_a_build_waits_while_another_run_holds_its_flavour(project, session_id, no_leaked_containers,
                                                           tmp_path: Path) -> None:
    """Deterministic: another process holds the flavour's lock (as a running build does) for as long as the
    test wants; the build must wait, saying who holds it, and build only once the lock is free."""
    flavour = project.flavour(VERSION)
    _untag(project)
    lock_dir = tmp_path / "locks"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, flavour.tag, str(lock_dir)], env=_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        waiting = _popen(project, "build", flavour.tag, env=_env(**{build_mutex.LOCK_DIR_ENV: str(lock_dir)}))
        time.sleep(3)  # ample for a cached build, which takes about a second once it may start
        assert waiting.poll() is None, _finish(waiting)
        assert project.image_id(VERSION) is None  # nothing built or tagged while the lock is held
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    _, err = _finish(waiting)
    assert waiting.returncode == 0, err
    assert f"{flavour.tag}: another build of it is running (pid {holder.pid}); waiting" in err, err
    labels = engine.images.image_labels(names.local_ref(flavour.tag))
    assert labels is not None and labels[names.FLAVOUR_ID_LABEL] == flavour.id


def test_two_builds_of_one_flavour_at_once_end_with_one_build_and_the_right_image(
        project, session_id, no_leaked_containers, tmp_path: Path) -> None:
    """Two real runs at once, whichever gets the lock first: one builds and writes the log, the other waits
    for it or finds its image up to date; both succeed, and nothing is left half-tagged or dangling."""
    flavour = project.flavour(VERSION)
    _untag(project)
    dangling_images = dangling_since(session_id)
    log = project.root / "reports" / flavour.tag / "build.log"
    log.unlink(missing_ok=True)
    env = _env(**{build_mutex.LOCK_DIR_ENV: str(tmp_path / "locks")})

    runs = [_popen(project, "build", flavour.tag, env=env) for _ in range(2)]
    results = [_finish(run) for run in runs]

    for run, (_, err) in zip(runs, results):
        assert run.returncode == 0, err
    assert sum("up to date" in err for _, err in results) >= 1  # the later one did not build it again
    labels = engine.images.image_labels(names.local_ref(flavour.tag))
    assert labels is not None and labels[names.FLAVOUR_ID_LABEL] == flavour.id
    for alias in flavour.aliases:
        assert engine.images.image_inspect(names.local_ref(alias))["Id"] == project.image_id(VERSION)
    assert log.read_text(encoding="utf-8").count(f"flavour {flavour.tag} id") == 1  # one writer only
    assert not dangling_images()


# --- a full disk -------------------------------------------------------------------------------------------

@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (needs root, as CI has); unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        if in_ci():
            pytest.fail(f"CI needs a tmpfs for the full-disk tests: {done.stderr}")
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def _fill(directory: Path, leave: int = 0) -> None:
    """Fill the file system of `directory` up to `leave` free bytes."""
    filler = directory / "filler"
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    with filler.open("wb") as stream, contextlib.suppress(OSError):
        stream.write(b"\0" * max(0, free - leave))


def _no_leftovers(session_id: str, dangling_images, tmpdir: Path) -> None:
    assert not session_containers(session_id)
    assert not dangling_images()
    assert not list(tmpdir.glob("xla-images-context-*")), list(tmpdir.iterdir())
    assert not list(tmpdir.glob("xla-images-base-stage-*")), list(tmpdir.iterdir())


def test_full_tmpdir_while_writing_the_build_context(project, session_id, full_disk: Path) -> None:
    # The 3 MB torch wheel cannot be hard-linked across file systems, and does not fit when copied.
    flavour = project.flavour(VERSION)
    _untag(project)
    dangling_images = dangling_since(session_id)
    tmpdir = full_disk / "tmp"
    tmpdir.mkdir()

    result = _run(project, "build", flavour.tag, env=_env(TMPDIR=str(tmpdir)))

    assert result.returncode == 1, result.stderr
    assert "cannot write the build context" in result.stderr and str(tmpdir) in result.stderr, result.stderr
    assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
    assert project.image_id(VERSION) is None
    _no_leftovers(session_id, dangling_images, tmpdir)  # the partial context went with its temp dir

    retry = _run(project, "build", flavour.tag)  # the same build with room to write: it completes
    assert retry.returncode == 0, retry.stderr
    assert engine.images.image_labels(names.local_ref(flavour.tag))[names.FLAVOUR_ID_LABEL] == flavour.id


def test_full_reports_disk_stops_the_build_naming_the_log(project, session_id, full_disk: Path,
                                                          tmp_path: Path) -> None:
    flavour = project.flavour(VERSION)
    dangling_images = dangling_since(session_id)
    good = project.image_id(VERSION)
    reports = full_disk / "reports"
    _fill(full_disk, leave=0)

    result = _run(project, "build", "--force", flavour.tag, "--reports", str(reports))

    log = reports / flavour.tag / "build.log"
    assert result.returncode == 1, result.stderr
    assert f"cannot write the build log {log}: No space left on device" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert project.image_id(VERSION) == good  # stopped before anything was tagged: the good image stays
    _no_leftovers(session_id, dangling_images, tmp_path)


def test_full_disk_under_published_json_keeps_the_old_file(project, full_disk: Path) -> None:
    published = full_disk / "published.json"
    old = {"schema": 1, "flavours": {}}
    published.write_text(json.dumps(old) + "\n", encoding="utf-8")
    _fill(full_disk, leave=0)
    # The writer itself, as push calls it once a flavour is verified (the push is tested elsewhere).
    flavour = project.flavour(VERSION)
    entry = model_published.Published(flavour.tag, flavour.tags, "127.0.0.1:5020/x", "sha256:" + "a" * 64, {},
                              flavour.to_json(), "now")
    with pytest.raises(Exception) as raised:
        publish.record_published(published, [entry])
    assert getattr(raised.value, "rule", None) == "disk-write"
    assert "No space left on device" in str(raised.value) and str(published) in str(raised.value)
    assert json.loads(published.read_text(encoding="utf-8")) == old
    assert sorted(path.name for path in full_disk.iterdir()) == ["filler", "published.json"]


# --- Ctrl-C during `test` ----------------------------------------------------------------------------------

def _role_containers(session_id: str, role: str) -> list[dict]:
    return [item for item in session_containers(session_id)
            if (item.get("Labels") or {}).get(engine.containers.CREATED_BY_LABEL) == role]


@pytest.mark.usefixtures("ctrl_c_raises")  # the child starts with SIGINT at its default
@pytest.mark.parametrize("phase", ["smoke", "checks"])
def test_ctrl_c_during_test_leaves_no_container_and_no_half_report(project, session_id, no_leaked_containers,
                                                                   phase: str) -> None:
    """`test` runs the smoke suite (the layer scan reading `docker save` beside it on a thread), then the image
    checks: Ctrl-C in either leaves no container, no report of the phase it cut, and only whole ones before."""
    flavour = project.flavour(VERSION)
    if project.image_id(VERSION) is None:  # an earlier test of the module failed half-way
        assert _run(project, "build", flavour.tag).returncode == 0
    reports = project.root / "reports" / flavour.tag

    process = _popen(project, "test", flavour.tag)
    deadline = time.monotonic() + 120
    while not _role_containers(session_id, phase):  # that phase's container is up
        assert process.poll() is None and time.monotonic() < deadline, _finish(process)
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGINT)
    _, err = _finish(process, timeout=120)

    assert process.returncode == 130, err
    assert err.rstrip().splitlines()[-1] in ("aborted", "interrupted"), err
    assert "Traceback" not in err
    no_leaked_containers()
    cut = ("smoke.json", "smoke.xml", "checks.json", "checks.xml") if phase == "smoke" else ("checks.json",
                                                                                             "checks.xml")
    for name in cut:
        assert not (reports / name).exists(), f"a run interrupted in its {phase} phase left {name}"
    if phase == "checks":  # the smoke suite ran whole before the checks began
        assert json.loads((reports / "smoke.json").read_text(encoding="utf-8"))["summary"]
    assert "Exception in thread" not in err  # the layer scan's thread ended quietly

    # Only checks that hold for the stand-in torch, to keep it short: the re-run ends whole and green.
    rerun = _run(project, "test", flavour.tag, "--checks-only", "-k", "python_version or labels or environment")
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads((reports / "checks.json").read_text(encoding="utf-8"))
    assert report["tag"] == flavour.tag and report["summary"]["passed"] == 3, report
    assert (reports / "checks.xml").read_text(encoding="utf-8").rstrip().endswith("</testsuites>")
