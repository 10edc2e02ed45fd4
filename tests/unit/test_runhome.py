"""runhome: the images' startup hook gives any UID a user name, a home and caches it can write."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from xla_images import runhome

UNKNOWN_UID = 2**31 - 7  # no passwd entry on any sane machine
# A python another UID may run (the test venv's may sit under root's home).
PYTHON = next((path for path in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(path, os.X_OK)), None)


def image_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "XDG_CACHE_HOME": f"{home}/.cache", "TORCHINDUCTOR_CACHE_DIR": f"{home}/.cache/ti"}


def test_a_uid_without_a_name_gets_its_digits_as_user(tmp_path: Path) -> None:
    environ = image_env(tmp_path)
    changed = runhome.settle(environ, UNKNOWN_UID, image_home=str(tmp_path), root=str(tmp_path))
    assert changed == {"USER": str(UNKNOWN_UID)} and environ["USER"] == str(UNKNOWN_UID)


def test_a_known_uid_or_a_given_name_is_left_alone(tmp_path: Path) -> None:
    environ = image_env(tmp_path)
    assert runhome.settle(environ, os.getuid(), image_home=str(tmp_path), root=str(tmp_path)) == {}
    environ = {**image_env(tmp_path), "LOGNAME": "someone"}
    assert runhome.settle(environ, UNKNOWN_UID, image_home=str(tmp_path), root=str(tmp_path)) == {}


def test_an_unwritable_home_moves_with_its_caches(tmp_path: Path) -> None:
    # Below a regular file nothing can be created, whoever asks (root included).
    blocker, scratch = tmp_path / "blocker", tmp_path / "scratch"
    blocker.write_text("")
    scratch.mkdir()
    home = blocker / "home"
    environ = {**image_env(home), "LOGNAME": "x", "PIP_CACHE_DIR": "/elsewhere/pip"}
    changed = runhome.settle(environ, os.getuid(), image_home=str(home), root=str(scratch))
    moved = scratch / f"xla-home-{os.getuid()}"
    assert changed == {"HOME": str(moved), "XDG_CACHE_HOME": f"{moved}/.cache",
                       "TORCHINDUCTOR_CACHE_DIR": f"{moved}/.cache/ti"}
    assert environ["PIP_CACHE_DIR"] == "/elsewhere/pip"  # a user's own choice stays
    assert moved.is_dir() and (moved.stat().st_mode & 0o777) == 0o700


def test_only_the_unwritable_cache_moves(tmp_path: Path) -> None:
    """A derived image's root-owned ~/.cache (a `RUN pip install` as root) under a writable HOME."""
    (tmp_path / ".cache").write_text("")  # a file where the cache directory should be: nothing goes below it
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    environ = {**image_env(tmp_path), "LOGNAME": "x"}
    changed = runhome.settle(environ, os.getuid(), image_home=str(tmp_path), root=str(scratch))
    assert set(changed) == {"XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"}
    assert environ["HOME"] == str(tmp_path)


def test_the_switch_turns_the_move_off(tmp_path: Path) -> None:
    environ = {"HOME": "/proc/nowhere", "LOGNAME": "x", runhome.SWITCH: "0"}
    assert runhome.settle(environ, os.getuid(), image_home="/proc/nowhere", root=str(tmp_path)) == {}


def test_a_fallback_someone_else_owns_is_refused(tmp_path: Path) -> None:
    other = tmp_path / f"xla-home-{UNKNOWN_UID}"
    other.mkdir()
    assert runhome.fallback_home(UNKNOWN_UID, str(tmp_path)) is None  # owned by this process's UID, not that one


def test_writable_looks_at_the_nearest_existing_parent(tmp_path: Path) -> None:
    assert runhome.writable(str(tmp_path / "a" / "b" / "c"))
    assert not runhome.writable("/proc/1/nothing/here")


def test_the_hook_runs_at_startup_and_never_breaks_python(tmp_path: Path) -> None:
    """Installed as the image installs it (a module and a .pth line), a python started by a UID without a name
    and without a writable /home/xla comes up with USER set and HOME under /tmp; one with a broken environment
    (a HOME that is a file) still starts."""
    if os.getuid() != 0 or not PYTHON:
        pytest.skip("starting a python as another UID needs root (CI runs as root) and a system python3")
    if os.path.exists(runhome.IMAGE_HOME):
        pytest.skip(f"{runhome.IMAGE_HOME} exists on this machine")
    site = Path(tempfile.mkdtemp(prefix="xla-images-hook-"))  # pytest's tmp_path is private to root
    site.chmod(0o755)
    (site / "xla_images_home.py").write_bytes(Path(runhome.__file__).read_bytes())
    (site / "xla_images_home.pth").write_text("import xla_images_home\n")
    program = f"import site, os; site.addsitedir({str(site)!r}); print(os.environ.get('USER'), os.environ['HOME'])"
    uid = 54321

    def as_uid() -> None:
        os.setgid(uid)
        os.setuid(uid)

    fallback = Path(runhome.FALLBACK_ROOT) / f"xla-home-{uid}"
    try:
        for home, expected in ((runhome.IMAGE_HOME, str(fallback)), (str(site / "xla_images_home.pth"), None)):
            env = {"PATH": os.environ.get("PATH", ""), "HOME": home}
            result = subprocess.run([PYTHON, "-S", "-c", program], env=env, capture_output=True, text=True,
                                    timeout=60, preexec_fn=as_uid, cwd="/")
            assert result.returncode == 0, result.stderr
            assert result.stdout.split() == [str(uid), expected or home]
    finally:
        shutil.rmtree(fallback, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
