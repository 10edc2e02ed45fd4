"""Every release in the matrix builds, passes its image checks and runs the smoke suite: one real flavour each.

The end to end (test_e2e_real_flavour.py) takes the newest release's cpu flavour through everything; this file
takes one flavour of every OTHER release through `build` and `test`, as a user would type them, so a release
whose image no longer builds (2.7.0 and 2.8.1 did not, once: a lock upgrading the venv's setuptools gave one
path two shapes in two layers) fails CI instead of a user. The flavours are chosen from the matrix, not
listed: per release, its default-ABI cpu flavour of `defaults.latest_python` (else its lowest python).

Cost on the 2-core CI machine, per release: build ~3 min on the containerd store (the wheels come from the
index), then the smoke suite ~1-2 min with a 16-layer compile check (the suite's default is 32; 2.7 and 2.8
compile the unrolled loop 3x slower than 2.9, and 16 layers still shows scan_layers winning by 5x and more) with
the checks' layer scan beside it, then the other checks, seconds; the image run as users run it (four
users/profiles, ~15 s each) and the smoke suite's environment, scan and tracing under the restricted profile. The builds run one after another on a thread
from the first test on, so the next release builds while this one is tested: the smoke suite's compile keeps
one core busy and the scan waits on the disk, which leaves room for pip and the layer export. Builds never run
side by side (each prunes the build cache once its image is tagged, which must not happen under another
build), and no test prunes the cache while a build may be running.
Disk: at most two release images at a time (the one tested and the one building, with its cache); each is
removed, with all its names, once tested.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
from packaging.version import Version

from xla_images import names
from xla_images.generate.plan import load_plan
from xla_images.model.flavour import Flavour
from xla_images.run import engine

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def one_flavour_per_release() -> list[Flavour]:
    """Per release but the newest (the end to end's), one default-ABI cpu flavour, of the python that carries
    `latest_cpu` where the release builds it, else of its lowest python."""
    flavours = load_plan(REPO / "matrix.yaml", None).flavours
    latest = [flavour.python for flavour in flavours if "latest_cpu" in flavour.aliases]
    by_release: dict[str, list[Flavour]] = {}
    for flavour in flavours:
        if flavour.accelerator.value == "cpu" and flavour.abi is flavour.release_default_abi and not flavour.is_nightly:
            by_release.setdefault(flavour.torch_xla, []).append(flavour)
    newest = max(by_release, key=Version)
    chosen = []
    for release, candidates in sorted(by_release.items(), key=lambda item: Version(item[0])):
        preferred = [flavour for flavour in candidates if flavour.python in latest]
        lowest = sorted(candidates, key=lambda flavour: Version(flavour.python))
        if release != newest:
            chosen.append((preferred or lowest)[0])
    return chosen


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "build.py"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=2400, env={**os.environ, "CI": "true", "PYTHONPATH": str(REPO)})


class Builds:
    """`build.py build TAG --prune-cache` of each flavour, in order, one at a time, on one thread."""

    def __init__(self, flavours: list[Flavour]) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="release-build")
        self._builds: dict[str, Future[subprocess.CompletedProcess[str]]] = {
            flavour.tag: self._pool.submit(cli, "build", flavour.tag, "--prune-cache") for flavour in flavours}

    def result(self, flavour: Flavour) -> subprocess.CompletedProcess[str]:
        return self._builds[flavour.tag].result()

    def close(self) -> None:
        """Builds not started are dropped; the one running is waited for (its own timeout bounds it)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def builds(request: pytest.FixtureRequest) -> Iterator[Builds]:
    """The builds of the flavours this run selected (`-k r2.8.1` builds 2.8.1 only), in the tests' order."""
    selected = [item.callspec.params["flavour"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    queued = Builds(selected)
    try:
        yield queued
    finally:
        queued.close()
        if os.environ.get("XLA_IMAGES_TEST_CLEANUP") == "1":
            engine.builds.prune_build_cache()


@pytest.mark.parametrize("flavour", one_flavour_per_release(), ids=lambda flavour: flavour.tag)
def test_release_builds_and_passes_checks_and_smoke(flavour: Flavour, builds: Builds, no_leaked_containers) -> None:
    try:
        built = builds.result(flavour)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        tested = cli("test", flavour.tag)
        print(tested.stdout[-2500:], file=sys.stderr)
        assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-3000:]
        ran_as_users_do(flavour)
        no_leaked_containers()
    finally:
        if os.environ.get("XLA_IMAGES_TEST_CLEANUP") == "1":
            # Not the build cache: the next release may be building on it (the fixture prunes it at the end).
            remove_every_name(flavour)


def ran_as_users_do(flavour: Flavour) -> None:
    """`test` ran this release's image as users run it (docs/running.md), and said so in its reports: as an
    arbitrary UID with GID 0, one outside group 0, the image's user 1000 and under the full restricted profile,
    each importing torch_xla, computing on XLA and passing xla-images-check (the image checks' test_runs_as); with
    no setuid file and nothing world-writable; and part of the smoke suite restricted (smoke-restricted.json)."""
    reports = REPO / names.REPORTS / flavour.tag
    checks = {check["name"]: check["status"] for check in json.loads((reports / "checks.json").read_text())["checks"]}
    wanted = [f"test_runs_as[{who}]" for who in ("uid-gid0", "uid-own-group", "image-user", "restricted")] + [
        "test_no_setuid_or_setgid_files", "test_nothing_world_writable", "test_no_stray_files_in_tmp_or_home",
        "test_image_user"]
    assert {name: checks.get(name) for name in wanted} == dict.fromkeys(wanted, "passed"), checks
    restricted = json.loads((reports / "smoke-restricted.json").read_text())
    assert restricted["summary"].get("passed", 0) >= 3 and not restricted["summary"].get("failed"), restricted


def remove_every_name(flavour: Flavour) -> None:
    """The flavour's tag and its aliases (r2.7_3.11_cpu...), then the image: an alias left behind would keep
    the whole image on disk while the next release builds."""
    attrs = engine.images.image_inspect(names.local_ref(flavour.tag))
    for name in flavour.tags:
        engine.images.remove_tag(names.local_ref(name))
    if attrs is not None:
        engine.images.remove_if_unnamed(attrs["Id"])
