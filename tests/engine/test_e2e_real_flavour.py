"""End to end on the real flavour r2.9.0_3.11_cpu: build -> test -> push -> resolve -> pull -> run -> downstream,
then the same flavour again through `docker buildx bake` on the generated docker-bake.json with --no-cache (every
step re-run): the bake image must be the first build's bit for bit (every layer digest, then the image id), so the
checks and smoke suite the first test ran on it hold for it.

Everything is real: the engine, the 7.8 GB image (built with the build API; an up-to-date image is reused),
the image checks and smoke suite inside it, the suite registry (XLA_IMAGES_TEST_REGISTRY, default
127.0.0.1:5000, as `ci/registry.sh start` runs it). Before the pull every local name of the image is removed,
so the pull really moves the layers; the pulled image is then given its names back.

Disk: a CI runner may have little more than 30 GB free beside the project's venv, and every copy of this image
costs ~7.5 GB. So the build prunes its build cache as soon as the image is tagged (`--prune-cache`), the pushed
blobs are garbage-collected when the suite registry is ours, the first image goes before bake rebuilds it (an
identical layer exported beside an existing one leaves an orphaned copy in dockerd 26, docker/buildx#2061), and
bake's build cache goes once its image is compared: the peak stays near one image, one cache and the engine's
temporary copy while `test` scans the layers (~20 GB above the idle machine). A runner with less than
MIN_FREE_GB free fails here first, clearly, instead of somewhere in the middle of a build.

Clean-up: the pushed manifest is deleted from the registry, the downstream image and the digest reference are
removed; `xla-images:r2.9.0_3.11_cpu` stays unless XLA_IMAGES_TEST_CLEANUP=1. Phase timings are printed and
recorded as JUnit properties; they are not asserted (benchmarks/bench_publish.py measures push and pull).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from reporters import QuietReporter
from xla_images import settings
from xla_images import names
from xla_images.generate import cigen
from xla_images.generate.plan import load_plan
from xla_images.model.flavour import Flavour
from xla_images.model.registry import Registry
from xla_images.run.building import bake, build
from xla_images.run import engine
from xla_images.run import registry as registries
from xla_images.run.shipping import prune, publish

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TAG = "r2.9.0_3.11_cpu"
REPOSITORY = "xla-images-e2e"
MIN_FREE_GB = 22  # one image (7.5), its build cache (7.5), the engine's scan copy (~5), and room to spare


class Phases:
    """Wall time per phase, printed at the end and kept as JUnit properties."""

    def __init__(self, record: Callable[[str, object], None]) -> None:
        self.record = record
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str) -> "_Phase":
        return _Phase(self, name)

    def report(self) -> str:
        total = sum(self.seconds.values())
        return "e2e phases: " + ", ".join(f"{k} {v:.0f}s" for k, v in self.seconds.items()) + f"; total {total:.0f}s"


class _Phase:
    def __init__(self, phases: Phases, name: str) -> None:
        self.phases, self.name = phases, name

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        seconds = time.monotonic() - self.started
        self.phases.seconds[self.name] = seconds
        self.phases.record(f"seconds_{self.name}", round(seconds, 1))
        print(f"[e2e] {self.name}: {seconds:.0f}s", file=sys.stderr)


def cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "build.py"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CI": "true", "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def registry() -> Registry:
    registry = Registry.parse(os.environ.get("XLA_IMAGES_TEST_REGISTRY", "127.0.0.1:5000") + "/" + REPOSITORY)
    client = registries.RegistryClient(registry, retry=registries.RetryPolicy(attempts=2, first_wait=0.2))
    client.check_reachable()  # a Failure here names the registry and `ci/registry.sh start`
    return registry


def docker_root() -> Path:
    return Path(engine.connection.engine_info().get("DockerRootDir") or "/var/lib/docker")


def free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / 1e9


@pytest.fixture(scope="module", autouse=True)
def enough_disk() -> None:
    """Fail up front, naming the numbers, where a runner has too little disk for one real image."""
    root = docker_root()
    free = free_gb(root)
    print(f"[e2e] disk free under {root}: {free:.1f} GB", file=sys.stderr)
    if free < MIN_FREE_GB:
        pytest.fail(f"the real-flavour end to end needs ~{MIN_FREE_GB} GB free under {root}; {free:.1f} GB are "
                    "(run ci/cleanup.sh, or free space)")


def collect_registry_garbage(registry: Registry) -> None:
    """Give the pushed blobs' ~4.3 GB back when the registry is one ci/registry.sh runs here."""
    local = prune.local_registry(registry)
    if local is not None:
        collected = prune.garbage_collect(local, lambda line: None)
        print(f"[e2e] registry garbage collection freed {collected.freed / 1e9:.1f} GB", file=sys.stderr)


@pytest.fixture(scope="module", autouse=True)
def real_flavour_names() -> Iterator[None]:
    """The built image stays for the bake test below; with XLA_IMAGES_TEST_CLEANUP=1 its names go at the end."""
    yield
    if os.environ.get("XLA_IMAGES_TEST_CLEANUP") == "1":
        (flavour,) = load_plan(REPO / "matrix.yaml").select((TAG,))
        for name in flavour.tags:
            engine.images.remove_tag(names.local_ref(name))


@pytest.fixture
def phases(record_property: Callable[[str, object], None]) -> Iterator[Phases]:
    recorded = Phases(record_property)
    yield recorded
    print(recorded.report(), file=sys.stderr)


def test_real_flavour_build_test_push_resolve_pull_run_downstream(tmp_path: Path, registry: Registry,
                                                                  phases: Phases, plain_install) -> None:
    started = time.monotonic()
    plan = load_plan(REPO / "matrix.yaml")
    (flavour,) = plan.select((TAG,))
    image = names.local_ref(flavour.tag)
    client = registries.RegistryClient(registry)
    digest = None
    pulled_ref = None
    downstream = f"xla-images-e2e/downstream:{os.getpid()}"
    try:
        with phases("build"):
            (result,) = build.build_flavours(plan, [flavour], build.BuildOptions(prune_cache=True), QuietReporter())
            assert result.outcome in (build.Outcome.BUILT, build.Outcome.SKIPPED), result.message
            image_id = build.built_image_id(flavour)
            assert image_id is not None

        reports = tmp_path / "reports"
        with phases("test"):
            tested = plain_install.run("test", TAG, "--reports", str(reports), cwd=REPO)  # as a plain `pip install .`
        assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
        checks_report = json.loads((reports / TAG / "checks.json").read_text())
        smoke_report = json.loads((reports / TAG / "smoke.json").read_text())
        assert checks_report["summary"]["failed"] == 0 and checks_report["summary"]["passed"] >= 14
        assert smoke_report["summary"]["failed"] == 0 and smoke_report["summary"]["error"] == 0
        assert smoke_report["summary"]["passed"] >= 4
        for name in ("checks.xml", "smoke.xml"):
            assert (reports / TAG / name).stat().st_size > 0
        phases.record("smoke_seconds_in_image", smoke_report["summary"]["seconds"])
        phases.record("checks_seconds", checks_report["summary"]["seconds"])

        published = tmp_path / "published.json"
        with phases("push"):
            pushed = cli("push", TAG, "--registry", registry.name, "--published", str(published))
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        digest = json.loads(published.read_text())["flavours"][TAG]["digest"]
        for name in flavour.tags:
            assert client.manifest_digest(name) == digest

        with phases("resolve"):
            resolved = cli("resolve", "--abi", "cxx11", "--python", "3.11", "--torch-xla", "2.9",
                           "--accelerator", "cpu", "--published", str(published))
        assert resolved.returncode == 0, resolved.stderr
        pulled_ref = resolved.stdout.strip()
        assert pulled_ref == registry.digest_ref(digest)

        # Drop every local name and the image with its untagged build parents: the pull must move the layers.
        for name in flavour.aliases:
            engine.images.remove_tag(names.local_ref(name))
        engine.images.remove_image(image)
        assert engine.images.image_inspect(image_id) is None
        with phases("pull"):
            pulled = cli("pull", "--abi", "cxx11", "--python", "3.11", "--accelerator", "cpu",
                         "--published", str(published))
        assert pulled.returncode == 0, pulled.stderr[-3000:]
        pulled_attrs = engine.images.image_inspect(pulled_ref)
        assert pulled_attrs is not None and pulled_attrs["Id"] == image_id  # bit for bit the image we tested
        for name in flavour.tags:
            engine.images.tag_image(pulled_ref, names.LOCAL_REPOSITORY, name)
        assert build.built_image_id(flavour) == image_id

        with phases("run"):
            ran = engine.containers.run_container(
                pulled_ref, ["python", "-c", "import torch_xla; print(torch_xla.__version__)"],
                role="e2e", options=engine.containers.RunOptions(environment={"PJRT_DEVICE": "CPU"}),
                timeout=600)
        assert ran.exit_code == 0, ran.output[-2000:]
        assert ran.output.strip().splitlines()[-1] == flavour.torch_xla

        with phases("downstream"):
            engine.classic.build_directory(REPO / "examples" / "downstream", downstream, buildargs={"BASE": pulled_ref})
            app = engine.containers.run_container(downstream, ["python", "/app/app.py"], role="e2e", timeout=600)
        assert app.exit_code == 0, app.output[-2000:]
        assert "downstream app: torch 2.9.0" in app.output and "result 16.0" in app.output
        assert f"image {TAG}" in app.output
    finally:
        _restore_names(flavour, pulled_ref)
        if digest is not None:
            client.delete_manifest(digest)
            collect_registry_garbage(registry)
        engine.images.remove_image(downstream, force=True)
        if pulled_ref is not None:
            engine.images.remove_tag(pulled_ref)
    leftovers = engine.connection.api().containers(all=True, filters={"ancestor": image_id})
    assert leftovers == [], f"containers left behind: {[item['Names'] for item in leftovers]}"
    # Timings are reported, never asserted (house rule: speed targets live in benchmarks/).
    phases.record("seconds_total", round(time.monotonic() - started, 1))


def _restore_names(flavour: Flavour, pulled_ref: str | None) -> None:
    """Whatever failed after the local names were dropped, give them back if the pulled image is here."""
    if pulled_ref is None or engine.images.image_inspect(names.local_ref(flavour.tag)) is not None:
        return
    if engine.images.image_inspect(pulled_ref) is not None:
        for name in flavour.tags:
            engine.images.tag_image(pulled_ref, names.LOCAL_REPOSITORY, name)


BAKE_REPOSITORY = "xla-images-e2e-bake"


def test_bake_rebuilds_the_real_flavour_bit_for_bit(tmp_path: Path, phases: Phases) -> None:
    """bake from the generated docker-bake.json, from a pruned cache and with --no-cache (every step runs again,
    pip installs every wheel anew): what an empty cache on another machine does. Every layer, and then the image
    id (config and labels too), must equal the build test's: the image that test checked and smoke-tested."""
    if not engine.buildkit.use_buildkit(settings.read_builder()):
        pytest.fail(f"CI needs BuildKit for bake: {engine.buildkit.buildx_info().problem}")
    plan = load_plan(REPO / "matrix.yaml")
    (flavour,) = plan.select((TAG,))
    first = build.built_image_id(flavour)
    assert first is not None, "the build test leaves xla-images:" + TAG
    built = engine.images.image_layers(first)
    target = cigen.bake_target_name(flavour)
    bake_ref = f"{BAKE_REPOSITORY}:{TAG}"
    lines: list[str] = []
    # The first image goes before bake runs: dockerd 26 with BuildKit on the classic store orphans the snapshot of
    # every layer it exports that the image store already holds (docker/buildx#2061) — 7 GB of overlay2 no prune
    # frees. (The containerd store orphans none, but would hold both images at once.)
    for name in flavour.tags:
        engine.images.remove_tag(names.local_ref(name))
    engine.images.remove_if_unnamed(first)
    engine.builds.prune_build_cache()
    try:
        with phases("bake"):
            override = bake.assemble_bake_contexts(plan, [flavour], tmp_path / "bake")
            # Into the containerd store, layers compressed as `build` stores them: the same bytes, the same id.
            export = plan.site.compression if engine.connection.image_store() == "containerd" else None
            engine.buildkit.bake([REPO / cigen.BAKE_FILE, override], [target], lines.append, no_cache=True,
                                 overrides=[f"{target}.tags={bake_ref}"], export=export)
        cached = [line for line in lines if line.endswith(" CACHED")]
        assert len(cached) <= 2, f"--no-cache took steps from the cache: {cached}"  # FROM metadata only
        baked = engine.images.image_layers(bake_ref)
        assert len(baked) == len(built)
        differing = [index for index, (old, new) in enumerate(zip(built, baked)) if old != new]
        assert not differing, f"layers {differing} of {len(built)} differ between build.py and bake --no-cache"
        assert engine.images.image_labels(bake_ref)[names.FLAVOUR_ID_LABEL] == flavour.id
        baked_id = engine.images.image_inspect(bake_ref)["Id"]
        assert baked_id == first, (f"bake's image {baked_id} has build.py's layers but not its id {first}: "
                                   "its config differs (labels, environment or history)")
    finally:
        attrs = engine.images.image_inspect(bake_ref)
        if attrs is not None and attrs["Id"] == first:  # the same image, bit for bit: it gets its names back
            for name in flavour.tags:
                engine.images.tag_image(bake_ref, names.LOCAL_REPOSITORY, name)
        engine.images.remove_tag(bake_ref)
        if attrs is not None:
            engine.images.remove_if_unnamed(attrs["Id"])
        engine.builds.prune_build_cache()
