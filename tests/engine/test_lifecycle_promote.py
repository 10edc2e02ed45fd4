"""`build.py promote` between two real registries (streamed blobs) and within one (cross-repository mounts).

Images are tiny and written over the registry API (lifecycle_support), under the tags of a throw-away matrix's
flavour, so promotion is tested exactly as it runs: by the CLI, registry to registry, no local engine involved.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import lifecycle_support as support
from registry_process import RegistryProcess, running
from xla_images.generate.plan import load_plan
from xla_images.run import engine

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RegistryProcess, RegistryProcess]]:
    """Two registries for the module; each test uses repositories of its own (and counts blobs as deltas)."""
    with running(tmp_path_factory.mktemp("staging"), support.PORTS) as staging, \
            running(tmp_path_factory.mktemp("production"), support.PORTS) as production:
        yield staging, production


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # Two releases of our own: the newer carries `latest_cpu`, so tags and aliases are both promoted.
        base = f"7.{os.getpid() % 1000}"
        self.versions = (f"{base}.{int(time.time()) % 1000}", f"{base}.{int(time.time()) % 1000 + 1}")
        releases = "".join(f"  \"{v}\":\n    torch: \"{v}\"\n    pytorch_git_rev: v{v}\n    xla_git_rev: v{v}\n"
                           f"    python_support: \">=3.11,<3.12\"\n" for v in self.versions)
        (root / "matrix.yaml").write_text(
            "schema: 1\ndefaults:\n  pythons: [\"3.11\"]\n  accelerators: [cpu]\n  latest_python: \"3.11\"\n"
            f"releases:\n{releases}", encoding="utf-8")
        (root / "site.yaml").write_text("registry: 127.0.0.1:1/unused\nca_bundle: none\nwheel_sources:\n"
                                        "  - name: test\n    match: {torch_xla: \">=0\"}\n", encoding="utf-8")
        self.flavours = list(load_plan(root / "matrix.yaml", root / "site.yaml").flavours)

    @property
    def published(self) -> Path:
        return self.root / "published.json"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(REPO / "build.py"), args[0], "--matrix",
                               str(self.root / "matrix.yaml"), *args[1:]], cwd=self.root,
                              env={**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, timeout=300)


def transfers(stdout: str) -> dict[str, dict[str, int]]:
    return {line.split("\t")[0]: json.loads(line.split("\t")[2]) for line in stdout.splitlines() if "\t" in line}


def test_promote_streams_blobs_between_registries_and_verifies_the_digest(registries, tmp_path: Path) -> None:
    staging, production = registries
    project = Project(tmp_path / "project")
    flavour = project.flavours[-1]
    assert len(flavour.tags) == 3  # tag, rX.Y alias, latest_cpu
    # 2.5 MiB of its own (incompressible): with 1 MiB chunks the layer goes up in PATCHes, the rest in one PUT.
    image = support.push_image(staging, "stage1", list(flavour.tags), os.urandom(5 << 19),
                               labels={"io.xla-images.tag": flavour.tag})
    stored = production.blobs()[0]

    result = project.cli("promote", flavour.tag, "--from", f"{staging.host}/stage1", "--to",
                         f"{production.host}/prod1", "--chunk-mb", "1")
    assert result.returncode == 0, result.stderr
    moved = transfers(result.stdout)[flavour.tag]
    assert moved["copied"] == 3 and moved["bytes_copied"] == image.total  # config + 2 layers, every byte
    assert moved["mounted"] == 0 and moved["present"] == 0 and moved["manifests"] == 3
    assert production.tags("prod1") == sorted(flavour.tags)
    assert {production.digest("prod1", tag) for tag in flavour.tags} == {image.digest}
    assert production.blobs()[0] - stored == 3 + 1  # the three blobs and the manifest, which is a blob too
    entry = json.loads(project.published.read_text())["flavours"][flavour.tag]
    assert entry["digest"] == image.digest and entry["labels"] == {"io.xla-images.tag": flavour.tag}
    assert [copy["ref"] for copy in entry["promotions"]] == [f"{production.host}/prod1@{image.digest}"]
    assert entry["promotions"][0]["from"] == f"{staging.host}/stage1@{image.digest}"

    again = project.cli("promote", flavour.tag, "--from", f"{staging.host}/stage1", "--to",
                        f"{production.host}/prod1")
    assert again.returncode == 0, again.stderr
    assert transfers(again.stdout)[flavour.tag] | {"manifests": 0} == {
        "mounted": 0, "copied": 0, "present": 3, "bytes_mounted": 0, "bytes_copied": 0, "manifests": 0}
    assert len(json.loads(project.published.read_text())["flavours"][flavour.tag]["promotions"]) == 1

    # What the destination holds is a real image: the engine pulls it by digest.
    ref = f"{production.host}/prod1@{image.digest}"
    try:
        engine.transfer.pull_image(ref, None)
    finally:
        engine.images.remove_image(ref, force=True)


def test_promote_within_one_registry_mounts_every_blob(registries, tmp_path: Path) -> None:
    staging, _ = registries
    project = Project(tmp_path / "project")
    flavours = project.flavours
    images = [support.push_image(staging, "stage2", list(f.tags), os.urandom(64 << 10)) for f in flavours]
    stored = staging.blobs()

    result = project.cli("promote", *(f.tag for f in flavours), "--from", f"{staging.host}/stage2", "--to",
                         f"{staging.host}/prod2")
    assert result.returncode == 0, result.stderr
    moved = transfers(result.stdout)
    # The shared layer is mounted for the first flavour and already there for the second.
    assert moved[flavours[0].tag]["mounted"] == 3 and moved[flavours[1].tag]["mounted"] == 2
    assert moved[flavours[1].tag]["present"] == 1
    assert all(item["copied"] == 0 and item["bytes_copied"] == 0 for item in moved.values())
    assert staging.blobs() == stored  # a mount links blobs; no byte of layer data was written
    for flavour, image in zip(flavours, images):
        assert {staging.digest("prod2", tag) for tag in flavour.tags} == {image.digest}


def test_promote_copies_an_index_and_its_child(registries, tmp_path: Path) -> None:
    staging, production = registries
    project = Project(tmp_path / "project")
    flavour = project.flavours[0]
    child = support.push_image(staging, "stage3", [], os.urandom(32 << 10))
    index = support.push_index(staging, "stage3", list(flavour.tags), child)

    result = project.cli("promote", flavour.tag, "--from", f"{staging.host}/stage3", "--to",
                         f"{production.host}/prod3")
    assert result.returncode == 0, result.stderr
    assert {production.digest("prod3", tag) for tag in flavour.tags} == {index}
    assert production.digest("prod3", child.digest) == child.digest
    assert transfers(result.stdout)[flavour.tag]["copied"] == 3


def test_a_flavour_missing_at_the_source_fails_and_writes_nothing(registries, tmp_path: Path) -> None:
    staging, production = registries
    project = Project(tmp_path / "project")
    present, missing = project.flavours
    support.push_image(staging, "stage4", list(present.tags), os.urandom(16 << 10))
    stored = production.blobs()

    result = project.cli("promote", present.tag, missing.tag, "--from", f"{staging.host}/stage4", "--to",
                         f"{production.host}/prod4")
    assert result.returncode == 1
    assert "[promote-source]" in result.stderr and missing.tag in result.stderr and "Traceback" not in result.stderr
    assert "nothing was written" in result.stderr
    assert production.tags("prod4") == [] and production.blobs() == stored
    assert not project.published.exists()
