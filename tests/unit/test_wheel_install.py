"""xla_images/wheel_install.py: the lock installed by pips in parallel gives the one-step install's files.

The planning functions are tested pure; the installer itself runs with a real pip in throwaway venvs, against a
find-links folder of small wheels, and is compared file for file with `pip install --require-hashes -r lock`.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Callable

import pytest

from xla_images import wheel_install
from xla_images.model.lockfile import LockEntry
from xla_images.wheel_install import deal, read_lock, shared_groups, wheel_files


def wheel(directory: Path, name: str, version: str, files: dict[str, bytes], entry_points: str = "") -> Path:
    """A minimal valid wheel of `files` (pip checks RECORD hashes and needs METADATA and WHEEL)."""
    dist_info = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    members[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if entry_points:
        members[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    record = io.StringIO()
    for path, data in members.items():
        digest = hashlib.sha256(data).digest()
        record.write(f"{path},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(data)}\n")
    record.write(f"{dist_info}/RECORD,,\n")
    members[f"{dist_info}/RECORD"] = record.getvalue().encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path


def lock_text(wheels: list[Path]) -> str:
    lines = ["# requirements: test", "# inputs: sha256:" + "0" * 64, ""]
    for path in sorted(wheels):
        name, version = path.name.split("-")[:2]
        lines.append(LockEntry(name, version, hashlib.sha256(path.read_bytes()).hexdigest(), path.name).line())
    return "\n".join(lines) + "\n"


# --- planning ----------------------------------------------------------------------------------------------------

def test_read_lock_keeps_wheel_lines_verbatim_and_skips_comments() -> None:
    alpha = "alpha==1 --hash=sha256:" + "a" * 64 + "  # alpha-1-py3-none-any.whl"
    text = f"# header\n\n{alpha}\n  \nbeta==2 --hash=sha256:{'b' * 64}\n"
    entries = read_lock(text)
    assert [(entry.index, entry.name) for entry in entries] == [(0, "alpha"), (1, "beta")]
    assert entries[0].line == alpha


def test_wheel_files_maps_members_to_where_pip_puts_them(tmp_path: Path) -> None:
    path = wheel(tmp_path, "tool", "1.0", {"tool/__init__.py": b"x = 1\n", "tool-1.0.data/purelib/extra.py": b"",
                                           "tool-1.0.data/scripts/run-tool": b"#!python\n",
                                           "tool-1.0.data/data/share/tool.txt": b"t"},
                 entry_points="[console_scripts]\ntool = tool:main\n[other]\nnot-a-script = x:y\n")
    files = wheel_files(path)
    assert set(files) == {("lib", "tool/__init__.py"), ("lib", "extra.py"), ("scripts", "run-tool"),
                          ("data", "share/tool.txt"), ("scripts", "tool")}
    assert files[("lib", "tool/__init__.py")][1] == len(b"x = 1\n")


def test_shared_paths_with_the_same_bytes_group_wheels_and_different_bytes_are_named() -> None:
    same = {("lib", "nvidia/__init__.py"): (0, 0)}
    wheels = {0: {**same, ("lib", "nvidia/a.so"): (1, 10)},
              1: {("lib", "solo.py"): (2, 3)},
              2: {**same, ("lib", "nvidia/b.so"): (3, 10)}}
    groups, differing = shared_groups(wheels)
    assert sorted(groups) == [[0, 2], [1]] and differing == []
    wheels[1] = {("lib", "nvidia/a.so"): (9, 10)}  # the same path, other bytes: order would decide
    groups, differing = shared_groups(wheels)
    assert groups == [[0, 1, 2]] and differing == ["lib/nvidia/a.so"]
    # Scripts pip generates are never known to be equal.
    groups, differing = shared_groups({0: {("scripts", "run"): (-1, -1)},
                                       1: {("scripts", "run"): (-1, -1)}})
    assert differing == ["scripts/run"]


def test_deal_balances_bytes_biggest_first_keeps_groups_whole_and_is_stable() -> None:
    sizes = {0: 900, 1: 700, 2: 600, 3: 300, 4: 290, 5: 10, 6: 5}
    parts = deal([[0], [1], [2], [3, 4], [5], [6]], sizes, 2)
    # 900 -> A; 700 -> B; 600 -> B (1300); the group 590 -> A (1490); 10 and 5 -> B (1315).
    assert parts == [[0, 3, 4], [1, 2, 5, 6]]
    assert any({3, 4} <= set(part) for part in parts)
    assert parts == deal([[6], [5], [3, 4], [2], [1], [0]], sizes, 2)  # the input order does not matter
    assert deal([[0], [1]], sizes, 8) == [[0], [1]]  # no empty parts
    assert deal([[0], [1], [2]], sizes, 1) == [[0, 1, 2]]


# --- the installer, with a real pip ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with pip (made once: ensurepip takes seconds); tests install into copies of it."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True)
    return path


@pytest.fixture
def fresh_venv(pristine_venv: Path, tmp_path: Path) -> Callable[[], Path]:
    """Makes tmp_path/venv a fresh copy of the pristine venv, at the same path each time: the installs compared
    must see one path (pip writes it into scripts, their RECORD hashes and the .pyc files)."""
    def make() -> Path:
        path = tmp_path / "venv"
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(pristine_venv, path, symlinks=True)
        return path
    return make


def run_env(links: Path) -> dict[str, str]:
    """pip offline on `links`, none of this machine's pip settings (files or PIP_* variables) in the way."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links),
            "SOURCE_DATE_EPOCH": "315532800", "PYTHONHASHSEED": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def install_parallel(venv: Path, lock: Path, work: Path, env: dict[str, str],
                     jobs: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), wheel_install.__file__, "--lock", str(lock),
                           "--work", str(work), "--jobs", str(jobs)], env=env, capture_output=True, text=True,
                          timeout=300)


def install_serial(venv: Path, lock: Path, env: dict[str, str]) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir", "--require-hashes",
                    "--only-binary=:all:", "-r", str(lock)], env=env, check=True, capture_output=True, timeout=300)


def tree(venv: Path) -> dict[str, bytes]:
    """Every file and symlink of the venv, by relative path, with its bytes (a symlink: its target)."""
    found = {}
    for path in sorted(venv.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(venv))] = os.readlink(path).encode()
        elif path.is_file():
            found[str(path.relative_to(venv))] = path.read_bytes()
    return found


def wheels_for_test(links: Path, shared: bytes, other: bytes) -> list[Path]:
    links.mkdir()
    return [
        wheel(links, "alpha", "1.0", {"alpha/__init__.py": b"A = 1\n", "alpha/data.bin": bytes(200_000),
                                      "nsp/__init__.py": shared},
              entry_points="[console_scripts]\nalpha = alpha:main\n"),
        wheel(links, "beta", "2.0", {"beta/__init__.py": b"B = {1, 2, 3}\n", "nsp/__init__.py": other}),
        wheel(links, "gamma", "3.0", {"gamma.py": b"def g():\n    return 3\n", "gamma-3.0.data/scripts/gamma-run":
                                      b"#!python\nprint('g')\n"}),
        wheel(links, "delta", "4.0", {"delta/__init__.py": b"", "delta/big.bin": bytes(300_000)}),
    ]


@pytest.mark.parametrize(("shared_bytes", "jobs"), [("same", 2), ("different", 2), ("same", 1)])
def test_parallel_install_writes_the_one_step_installs_files(tmp_path: Path, fresh_venv: Callable[[], Path],
                                                             shared_bytes: str, jobs: int) -> None:
    links = tmp_path / "links"
    wheels = wheels_for_test(links, b"# nsp\n", b"# nsp\n" if shared_bytes == "same" else b"# other\n")
    lock = tmp_path / "requirements.lock"
    lock.write_text(lock_text(wheels))
    env = run_env(links)
    work = tmp_path / "work"
    venv = fresh_venv()
    result = install_parallel(venv, lock, work, env, jobs)
    assert result.returncode == 0, result.stdout + result.stderr
    parallel = tree(venv)
    venv = fresh_venv()
    install_serial(venv, lock, env)
    assert parallel == tree(venv)
    assert not work.exists()
    if jobs == 1:  # the one-step install alone
        assert "install_wheels:" not in result.stdout
        return
    assert "4 wheels downloaded" in result.stdout
    if shared_bytes == "same":
        assert "installed in 2 part(s)" in result.stdout
    else:
        assert "nsp/__init__.py" in result.stdout and "one pip installs the lock" in result.stdout
        assert "part(s)" not in result.stdout


def test_a_wheel_that_fails_its_hash_stops_the_install_names_it_and_leaves_no_downloads(
        tmp_path: Path, fresh_venv: Callable[[], Path]) -> None:
    links = tmp_path / "links"
    wheels = wheels_for_test(links, b"", b"")
    lock = tmp_path / "requirements.lock"
    good = hashlib.sha256((links / "gamma-3.0-py3-none-any.whl").read_bytes()).hexdigest()
    lock.write_text(lock_text(wheels).replace(good, "1" * 64))
    work = tmp_path / "work"
    venv = fresh_venv()
    result = install_parallel(venv, lock, work, run_env(links))
    assert result.returncode == 1
    assert "install_wheels: error: pip failed (gamma" in result.stderr
    assert "[gamma]" in result.stdout and "HASHES" in result.stdout.upper()
    assert not work.exists()
    assert "Traceback" not in result.stderr
    site = next(venv.glob("lib/python*/site-packages"))
    assert not list(site.glob("alpha*")) and not list(site.glob("delta*"))  # nothing installed after a failure


def test_a_work_folder_not_empty_or_a_lock_not_readable_is_refused_and_nothing_written(
        tmp_path: Path, fresh_venv: Callable[[], Path]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    lock = tmp_path / "requirements.lock"
    lock.write_text("")
    result = install_parallel(fresh_venv(), lock, work, run_env(tmp_path))
    assert result.returncode == 2 and f"{work} is not an empty directory" in result.stderr
    assert (work / "keep.txt").read_text() == "mine"
    result = install_parallel(fresh_venv(), tmp_path / "no-such.lock", tmp_path / "other", run_env(tmp_path))
    assert result.returncode == 2 and "cannot read the lock" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "other").exists()


def test_the_first_failure_stops_the_pips_still_running_and_starts_no_more(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An error path, with a stand-in `pip` package first on PYTHONPATH: `fail` exits 1 at once, `sleep` would
    take 2 minutes, `mark` leaves a file behind (it must never start)."""
    fake = tmp_path / "fake" / "pip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(textwrap.dedent(f"""\
        import pathlib, sys, time
        word = sys.argv[1]
        if word == "fail":
            print("no such wheel")
            sys.exit(1)
        if word == "sleep":
            time.sleep(120)
        pathlib.Path({str(tmp_path / "started")!r}).write_text(word)
        """))
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    started = time.monotonic()
    with pytest.raises(wheel_install.InstallError, match=r"pip failed \(broken, exit 1\): pip fail"):
        wheel_install._run_all([(["sleep"], "slow"), (["fail"], "broken"), (["mark"], "later")], jobs=2)
    assert time.monotonic() - started < 60
    assert not (tmp_path / "started").exists()
