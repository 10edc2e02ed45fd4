"""The nightly channel on the real engine and a real registry, with tiny fake dev wheels.

PyPI has no torch_xla nightlies and upstream's bucket is out of reach, so the nightly wheel source is a local
wheelhouse of `X.Y.Z.devYYYYMMDD` wheels. One project builds a consistent night: it passes the image checks and
is pushed under both nightly tags. Another installs a torch_xla whose wheel is named and versioned for the night
but whose module is an older build (what upstream once shipped, pytorch/xla#8475): the image checks fail and the
push is refused before anything reaches the registry.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import pytest

import lifecycle_support as support
from registry_process import RegistryProcess, running
from xla_images import names
from xla_images.model import lockfile
from xla_images.model.flavour import Flavour
from xla_images.run.checking import checks
from xla_images.run.packages import lock as wheels

BASE = "8.90.0"
NIGHT = "20261201"
STALE_NIGHT = "20261115"
TAG = "nightly_3.11_cpu"
CHECKS = "nightly or package_version or import_torch_xla or labels or environment"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryProcess]:
    with running(tmp_path / "state", support.PORTS) as process:
        yield process


def nightly_project(make_project: Callable, wheel_maker: Callable, registry_host: str, *,
                    torch_xla_module: str | None = None):
    """A project whose only release is a nightly of BASE, served by a wheelhouse of NIGHT's dev wheels."""
    project = make_project()
    root = project.root
    (root / "matrix.yaml").write_text(
        "schema: 1\n"
        "defaults:\n  pythons: [\"3.11\"]\n  accelerators: [cpu]\n  default_abi: cxx11\n  abis: [cxx11]\n"
        "  latest_python: none\n"
        f"releases:\n  \"{BASE}\":\n    channel: nightly\n    torch: \"{BASE}\"\n    pytorch_git_rev: nightly\n"
        "    xla_git_rev: master\n    python_support: \">=3.11,<3.12\"\n", encoding="utf-8")
    site = (root / "site.yaml").read_text(encoding="utf-8").split("wheel_sources:")[0]
    site = site.replace("registry: 127.0.0.1:5000/xla-images-test", f"registry: {registry_host}/xla-nightly")
    (root / "site.yaml").write_text(site + "wheel_sources:\n  - name: nightly-wheelhouse\n"
                                           "    match: {channel: nightly}\n    wheelhouse: nightly-wheels\n",
                                    encoding="utf-8")
    version = f"{BASE}.dev{NIGHT}"
    made = {name: wheel_maker(root / "nightly-wheels", name, version,
                              module_version=torch_xla_module if name == "torch_xla" else None)
            for name in ("torch", "torch_xla")}
    # What `build.py lock` writes for this night (pip's resolution of `>=8.90.0.dev0,<8.90.0a0`), by hand:
    # the engine suite never asks an index.
    plan = project.plan()
    (flavour,) = plan.flavours
    assert flavour.nightly_date is None and flavour.tags == (TAG,)  # unpinned until a lock names a night
    entries = [lockfile.LockEntry(name.replace("_", "-"), version, wheels.file_sha256(path), path.name, local=True)
               for name, path in made.items()]
    inputs = lockfile.lock_inputs(flavour, lockfile.group_requirements(plan.flavours, flavour))
    plan.lock_path(flavour).parent.mkdir(parents=True, exist_ok=True)
    plan.lock_path(flavour).write_text(lockfile.format_lock(flavour, inputs, entries), encoding="utf-8")
    pinned = project.plan()
    (flavour,) = pinned.flavours
    (pinned.flavour_dir(flavour) / "Dockerfile").write_text(pinned.rendered[flavour.tag]["Dockerfile"],
                                                            encoding="utf-8")
    return project, flavour


def run_checks(flavour: Flavour, tmp_path: Path) -> checks.ChecksResult:
    return checks.run(checks.CheckTarget(flavour, names.local_ref(flavour.tag), None), tmp_path / "reports",
                      keyword=CHECKS)


def test_a_consistent_night_is_checked_and_pushed_under_both_tags(
        make_project, wheel_maker, registry: RegistryProcess, tmp_path: Path, no_leaked_containers) -> None:
    project, flavour = nightly_project(make_project, wheel_maker, registry.host)
    assert flavour.tags == (TAG, f"{TAG}_{NIGHT}")
    assert flavour.labels["io.xla-images.nightly-date"] == NIGHT
    built = project.cli("build", TAG)
    assert built.returncode == 0, built.stderr

    result = run_checks(flavour, tmp_path)
    assert result.ok, result.failures()
    assert "test_nightly_is_the_claimed_night" in {outcome.name for outcome in result.outcomes}

    pushed = project.cli("push", TAG)
    assert pushed.returncode == 0, pushed.stderr
    assert registry.tags("xla-nightly") == [TAG, f"{TAG}_{NIGHT}"]
    assert registry.digest("xla-nightly", TAG) == registry.digest("xla-nightly", f"{TAG}_{NIGHT}")
    entry = json.loads((project.root / "published.json").read_text())["flavours"][TAG]
    assert entry["tags"] == [TAG, f"{TAG}_{NIGHT}"]
    assert entry["flavour"]["nightly_date"] == NIGHT and entry["flavour"]["torch_xla"] == f"{BASE}.dev{NIGHT}"


def test_a_stale_torch_xla_is_refused_before_anything_is_pushed(
        make_project, wheel_maker, registry: RegistryProcess, tmp_path: Path, no_leaked_containers) -> None:
    project, flavour = nightly_project(make_project, wheel_maker, registry.host,
                                       torch_xla_module=f"{BASE}.dev{STALE_NIGHT}")
    built = project.cli("build", TAG)
    assert built.returncode == 0, built.stderr  # pip is content: the wheel's name and metadata say NIGHT

    result = run_checks(flavour, tmp_path)
    failed = {outcome.name: outcome.message for outcome in result.outcomes if outcome.status == "failed"}
    assert "test_nightly_is_the_claimed_night" in failed
    assert f"stale build from {STALE_NIGHT}" in failed["test_nightly_is_the_claimed_night"]

    pushed = project.cli("push", TAG)
    assert pushed.returncode == 1, pushed.stderr
    assert "[nightly-versions]" in pushed.stderr and "Traceback" not in pushed.stderr
    assert f"torch_xla.__version__ is {BASE}.dev{STALE_NIGHT}" in pushed.stderr
    assert registry.tags("xla-nightly") == []
    assert registry.blobs() == (0, 0)
    assert not (project.root / "published.json").exists()
