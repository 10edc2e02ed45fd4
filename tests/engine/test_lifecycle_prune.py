"""`build.py prune` on a real registry that ci/registry.sh runs, with its garbage collection.

The repository holds a nightly series (five old nights, one recent, the moving tag), a release tag, and an image
that lost its tag to a newer push (untagged). One old night is named in a --protect file and the untagged image
is recorded in published.json. With --keep 2 --older-than 30 the recent night and the newest old one stay and
three old nights go: a dry run deletes nothing; the real run deletes those three manifests, collects the garbage with the registry stopped, and frees
exactly their blobs (config, own layer, manifest), counted on disk independently. Protected images still pull.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import lifecycle_support as support
from registry_process import RegistryProcess, running
from xla_images.run import engine

REPO = Path(__file__).resolve().parents[2]
SERIES = "nightly_3.11_cpu"
OLD_NIGHTS = ("20200101", "20200102", "20200103", "20200104", "20200105")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryProcess]:
    with running(tmp_path / "state", support.PORTS) as process:
        yield process


def cli(root: Path, registry: RegistryProcess, *args: str) -> subprocess.CompletedProcess[str]:
    (root / "matrix.yaml").write_text(
        "schema: 1\ndefaults:\n  pythons: [\"3.11\"]\n  accelerators: [cpu]\n  latest_python: \"3.11\"\n"
        "releases:\n  \"7.1.0\":\n    torch: \"7.1.0\"\n    pytorch_git_rev: v7.1.0\n    xla_git_rev: v7.1.0\n"
        "    python_support: \">=3.11,<3.12\"\n", encoding="utf-8")
    (root / "site.yaml").write_text(f"registry: {registry.host}/xla-prune\nca_bundle: none\nwheel_sources:\n"
                                    "  - name: test\n    match: {torch_xla: \">=0\"}\n", encoding="utf-8")
    return subprocess.run([sys.executable, str(REPO / "build.py"), "prune", "--matrix", str(root / "matrix.yaml"),
                           *args], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**registry.env, "CI": "true", "PYTHONPATH": str(REPO)})


def test_prune_keeps_the_newest_and_the_protected_then_collects_exactly_the_rest(
        registry: RegistryProcess, tmp_path: Path) -> None:
    repo = "xla-prune"
    recent = (datetime.date.today() - datetime.timedelta(days=1)).strftime("%Y%m%d")
    nights = {night: support.push_image(registry, repo, [f"{SERIES}_{night}"], os.urandom(48 << 10))
              for night in OLD_NIGHTS}
    newest = support.push_image(registry, repo, [f"{SERIES}_{recent}", SERIES], os.urandom(48 << 10))
    release = support.push_image(registry, repo, ["r7.1.0_3.11_cpu"], os.urandom(48 << 10))
    overwritten = support.push_image(registry, repo, ["scratch"], os.urandom(48 << 10))
    support.push_image(registry, repo, ["scratch"], os.urandom(48 << 10))  # `overwritten` is now untagged
    # cosign's signature tags name the signed digest: a deleted image's go with it, a kept image's stay.
    doomed_signature = support.push_image(registry, repo, [_cosign_tag(nights["20200103"].digest)], os.urandom(4096))
    kept_signature = support.push_image(registry, repo, [_cosign_tag(nights["20200105"].digest)], os.urandom(4096))
    assert registry.digest(repo, overwritten.digest) == overwritten.digest

    protect = tmp_path / "downstream-digests.txt"
    protect.write_text(f"# digests our downstream CI resolved\n{registry.host}/{repo}@{nights['20200102'].digest}\n")
    (tmp_path / "published.json").write_text(json.dumps({"schema": 1, "flavours": {"scratch": {
        "tag": "scratch", "tags": ["scratch"], "registry": f"{registry.host}/{repo}", "digest": overwritten.digest,
        "ref": f"{registry.host}/{repo}@{overwritten.digest}", "labels": {}, "flavour": {}, "pushed_at": ""}}}))
    doomed = [nights["20200101"], nights["20200103"], nights["20200104"]]
    tags_before = registry.tags(repo)
    blobs_before = registry.blobs()

    dry = cli(tmp_path, registry, "--keep", "2", "--older-than", "30", "--dry-run", "--protect", str(protect))
    assert dry.returncode == 0, dry.stderr
    would = sorted(line.split("\t")[1] for line in dry.stdout.splitlines() if line.startswith("would delete"))
    assert would == [f"{SERIES}_20200101", f"{SERIES}_20200103", f"{SERIES}_20200104"]
    assert registry.tags(repo) == tags_before and registry.blobs() == blobs_before

    real = cli(tmp_path, registry, "--keep", "2", "--older-than", "30", "--protect", str(protect), "--json")
    assert real.returncode == 0, real.stderr
    report = json.loads(real.stdout)
    assert sorted(report["deleted_digests"]) == sorted(image.digest for image in doomed)
    assert report["deleted_cosign_tags"] == [_cosign_tag(nights["20200103"].digest)]
    kept = {d["tag"]: d["reason"] for d in report["decisions"] if not d["delete"]}
    assert "protected" in kept[f"{SERIES}_20200102"] and "newest" in kept[f"{SERIES}_20200105"]
    assert report["pinned"] == [f"protected-{overwritten.digest[7:23]}"]

    # Exactly the doomed images' own blobs went: config, own layer and manifest (the shared layer stays).
    own = [len(image.manifest) + sum(size for digest, size in image.blobs.items() if digest != support.SHARED_DIGEST)
           for image in (*doomed, doomed_signature)]
    blobs_after = registry.blobs()
    assert blobs_before[0] - blobs_after[0] == 3 * (len(doomed) + 1)
    assert blobs_before[1] - blobs_after[1] == sum(own)
    assert report["gc"] == {"blobs_before": blobs_before[0], "blobs_after": blobs_after[0],
                            "bytes_before": blobs_before[1], "bytes_after": blobs_after[1],
                            "bytes_freed": blobs_before[1] - blobs_after[1]}
    assert registry.answers()  # started again after the collection
    deleted = {f"{SERIES}_{night}" for night in ("20200101", "20200103", "20200104")}
    deleted.add(_cosign_tag(nights["20200103"].digest))
    assert set(registry.tags(repo)) == (set(tags_before) - deleted) | set(report["pinned"])
    for image in doomed:
        assert registry.digest(repo, image.digest) is None
    for image in (newest, release, nights["20200105"], kept_signature):
        assert registry.digest(repo, image.digest) == image.digest
    for image in (nights["20200102"], overwritten):
        ref = f"{registry.host}/{repo}@{image.digest}"
        try:
            engine.transfer.pull_image(ref, None)  # the protected images survive the collection, whole
        finally:
            engine.images.remove_image(ref, force=True)


def _cosign_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".sig"


def test_bad_protect_file_is_a_clear_error_and_deletes_nothing(registry: RegistryProcess,
                                                                tmp_path: Path) -> None:
    support.push_image(registry, "xla-prune", [f"{SERIES}_20200101"], os.urandom(1024))
    protect = tmp_path / "protect.txt"
    protect.write_text("sha256:" + "a" * 64 + "\nlatest\n")
    result = cli(tmp_path, registry, "--keep", "0", "--older-than", "0", "--protect", str(protect))
    assert result.returncode == 2
    assert f"{protect}:2: error [protect-format]" in result.stderr and "Traceback" not in result.stderr
    assert registry.tags("xla-prune") == [f"{SERIES}_20200101"]
