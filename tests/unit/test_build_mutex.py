"""run.building.build_mutex: one build of a flavour at a time, held across real processes (an fcntl lock per tag)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xla_images.errors import Failure
from xla_images.run.building import build_mutex

HOLD = """
import sys, time
from pathlib import Path
from xla_images.run.building import build_mutex
with build_mutex.exclusive([sys.argv[1]], directory=Path(sys.argv[2])):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _holder(tmp_path: Path, name: str, seconds: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen([sys.executable, "-c", HOLD, name, str(tmp_path), str(seconds)], env=env,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_second_holder_waits_then_gets_the_lock(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "r9.9.9_3.11_cpu", 1.0)
    told: list[str] = []
    started = time.monotonic()
    with build_mutex.exclusive(["r9.9.9_3.11_cpu"], directory=tmp_path, waiting=told.append):
        waited = time.monotonic() - started
    holder.wait(timeout=30)
    assert waited > 0.3, "it did not wait for the holder"
    assert told == [f"r9.9.9_3.11_cpu: another build of it is running (pid {holder.pid}); waiting for it to finish"]


def test_a_lock_held_too_long_is_a_failure_naming_the_holder(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "t", 30)
    try:
        with pytest.raises(Failure) as caught:
            with build_mutex.exclusive(["t"], directory=tmp_path, timeout=0.3):
                pass
        assert caught.value.rule == "build-lock" and f"pid {holder.pid}" in caught.value.message
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with build_mutex.exclusive(["t"], directory=tmp_path, timeout=5):  # the kernel released it with the process
        pass


def test_other_names_do_not_wait_and_odd_names_stay_in_the_directory(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "a", 30)
    try:
        with build_mutex.exclusive(["b", "../../etc/x"], directory=tmp_path, timeout=0.5):
            pass
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert sorted(path.name for path in tmp_path.iterdir()) == [".._.._etc_x.lock", "a.lock", "b.lock"]
