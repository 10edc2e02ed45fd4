"""One real lock against the default index: the committed lock of the `latest_cpu` flavour is what `lock` makes today.

Needs the package index (and the site's CA bundle behind a TLS-intercepting proxy). Without the network the
test is skipped on a developer's machine and fails under CI, where the index is reachable.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from xla_images import names

from xla_images.generate.plan import load_plan
from xla_images.model import lockfile
from xla_images.run.packages import lock as wheels

ROOT = Path(__file__).resolve().parents[2]


def test_real_lock_matches_the_committed_one(tmp_path: Path) -> None:
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    plan = load_plan(tmp_path / "matrix.yaml")
    flavour = next(flavour for flavour in plan.flavours if "latest_cpu" in flavour.aliases)
    # The release's lowest python's committed locks: their python-independent pins are part of the resolution.
    anchor = lockfile.anchor_python(plan.flavours, flavour)
    for other in plan.flavours:
        if other.python == anchor and lockfile.release_family(other) == lockfile.release_family(flavour):
            plan.lock_path(other).parent.mkdir(parents=True)
            shutil.copy(ROOT / "Dockerfiles" / other.tag / names.LOCK_NAME, plan.lock_path(other))
    if not lockfile.aligned_pins(plan, flavour):
        pytest.skip(f"{flavour.tag} is its release's lowest python: no committed lock to align with")
    started = time.monotonic()
    report = wheels.lock(plan, [flavour])
    seconds = time.monotonic() - started
    if report.failed and not os.environ.get("CI"):
        pytest.skip(f"the package index is not reachable here: {report.failed[0].error.message[:300]}")
    assert report.failed == ()
    made = lockfile.read_lock(plan.lock_path(flavour))
    committed = lockfile.read_lock(ROOT / "Dockerfiles" / flavour.tag / names.LOCK_NAME)
    assert made.inputs == committed.inputs, "matrix.yaml changed: run ./build.py lock"
    # Exact pins are stable; the rest of the closure may move on as dependencies release (re-lock then).
    for name in ("torch", "torch-xla"):
        assert made.by_name()[name] == committed.by_name()[name]
    locked = set(made.by_name())
    assert {"nvidia-cudnn-cu12", "triton", "numpy", "absl-py"} <= locked and "libtpu" not in locked
    assert all(entry.filename.endswith(".whl") and len(entry.sha256) == 64 for entry in made.entries)
    print(f"locked {flavour.tag}: {len(made.entries)} wheels in {seconds:.1f}s")
