"""`ship` (run.pipeline) on the real engine and the suite's real registry, with tiny flavours (make_project).

One project, three runs: the first ships one release (a cpu/tpuvm pair) while a python with no base on this
machine is set aside as blocked; the second ships everything, finding the first release already in the registry
(a resumed run) and overlapping the next build with the current test; the third is a no-op. Each pushed image is
freed from the engine and recorded in published.json with the digest the registry serves. Then the same images
are shipped again to another repository, split across this engine and a second one (ci/second-engine.sh, over
TCP with mutual TLS, by its docker context): one release each, the same digests.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from second_engine_support import CONTEXT, copy_image
from xla_images import names
from xla_images.model.registry import Registry
from xla_images.run import engine, registry as registries

RELEASES = ("8.91.0", "8.92.0")
BLOCKED_PYTHON = "3.9"  # no Debian suite here ships it, and Docker Hub is unreachable: no base


@pytest.fixture(scope="module")
def shipped(make_project, tmp_path_factory):
    project = make_project(*RELEASES, accelerators=("cpu", "tpu"))
    matrix = project.matrix.read_text(encoding="utf-8")
    matrix = matrix.replace('pythons: ["3.11"]', f'pythons: ["3.11", "{BLOCKED_PYTHON}"]')
    project.matrix.write_text(matrix.replace('">=3.11,<3.12"', '">=3.9,<3.12"'), encoding="utf-8")
    project.write_locks()
    registry = f"127.0.0.1:5000/xla-images-test-pipeline-{uuid.uuid4().hex[:10]}"
    reports = tmp_path_factory.mktemp("reports")
    runs = {}
    common = ("--registry", registry, "--checks-only", "-k", "python_version or labels", "--reports", str(reports))
    runs["first"] = project.cli("ship", f"r{RELEASES[0]}_3.11_cpu", f"r{RELEASES[0]}_3.11_tpuvm",
                                f"r{RELEASES[0]}_{BLOCKED_PYTHON}_cpu", *common)
    runs["first.json"] = json.loads((reports / "pipeline.json").read_text(encoding="utf-8"))
    runs["second"] = project.cli("ship", *common)
    runs["second.json"] = json.loads((reports / "pipeline.json").read_text(encoding="utf-8"))
    runs["third"] = project.cli("ship", *common)
    runs["third.json"] = json.loads((reports / "pipeline.json").read_text(encoding="utf-8"))
    yield project, Registry.parse(registry, where="test"), runs
    for flavour in project.plan().every_image:
        for tag in flavour.tags:
            engine.images.remove_tag(names.local_ref(tag))


def by_tag(report: dict) -> dict[str, dict]:
    return {item["tag"]: item for item in report["flavours"]}


def test_a_machine_without_the_base_sets_the_image_aside_and_ships_the_rest(shipped) -> None:
    _, _, runs = shipped
    first = runs["first"]
    assert first.returncode == 0, first.stdout + first.stderr
    items = by_tag(runs["first.json"])
    blocked = items[f"r{RELEASES[0]}_{BLOCKED_PYTHON}_cpu"]
    assert blocked["result"] == "blocked"
    assert f"no base image for python {BLOCKED_PYTHON}" in blocked["reason"] and blocked["fix"]
    assert "build" not in blocked["phases"]
    assert [items[f"r{RELEASES[0]}_3.11_{accelerator}"]["result"] for accelerator in ("cpu", "tpuvm")] == \
        ["pushed", "pushed"]
    assert "Traceback" not in first.stderr


def test_a_second_run_resumes_and_overlaps_the_next_build_with_the_current_test(shipped) -> None:
    _, _, runs = shipped
    second = runs["second"]
    assert second.returncode == 0, second.stdout + second.stderr
    items = by_tag(runs["second.json"])
    assert {items[f"r{RELEASES[0]}_3.11_{a}"]["result"] for a in ("cpu", "tpuvm")} == {"held"}
    built = [items[f"r{RELEASES[1]}_3.11_{a}"] for a in ("cpu", "tpuvm")]
    assert [item["result"] for item in built] == ["pushed", "pushed"]
    first_test, next_build = built[0]["phases"]["test"], built[1]["phases"]["build"]
    assert next_build["start"] < first_test["start"] + first_test["seconds"], "the next build waited for the test"
    assert all(item["phases"]["push"]["ok"] for item in built)


def test_every_pushed_image_is_freed_and_recorded_with_the_registrys_digest(shipped) -> None:
    project, registry, runs = shipped
    published = json.loads((project.root / "published.json").read_text(encoding="utf-8"))["flavours"]
    client = registries.connect(registry, named=(registry.host,))
    pushed = [flavour for flavour in project.plan().flavours if flavour.python == "3.11"]
    assert len(pushed) == 4
    for flavour in pushed:
        assert engine.images.image_inspect(names.local_ref(flavour.tag)) is None, f"{flavour.tag} not freed"
        assert published[flavour.tag]["digest"] == client.manifest_digest(flavour.tag)
    assert f"r{RELEASES[0]}_{BLOCKED_PYTHON}_cpu" not in published


def test_a_third_run_is_a_no_op(shipped) -> None:
    _, _, runs = shipped
    third = runs["third"]
    assert third.returncode == 0, third.stdout + third.stderr
    results = {item["tag"]: item["result"] for item in runs["third.json"]["flavours"]}
    assert set(results.values()) == {"held", "blocked"}
    assert all(not item["phases"] for item in runs["third.json"]["flavours"])


def test_a_run_split_across_two_engines_pushes_the_same_images(shipped, second_engine, test_base: str,
                                                                tmp_path: Path) -> None:
    project, _, _ = shipped
    copy_image(test_base)  # the site's base, on the second engine too
    tags = [f"r{release}_3.11_{accelerator}" for release in RELEASES for accelerator in ("cpu", "tpuvm")]
    split = f"127.0.0.1:5000/xla-images-test-pipeline-split-{uuid.uuid4().hex[:10]}"
    published = tmp_path / "published.json"
    result = project.cli("ship", "--engine", "default", "--engine", CONTEXT, "--registry", split, "--checks-only",
                         "-k", "python_version or labels", "--reports", str(tmp_path / "reports"),
                         "--published", str(published), *tags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / "pipeline.json").read_text(encoding="utf-8"))
    assert [(item["engine"], item["exit_code"]) for item in report["engines"]] == [("default", 0), (CONTEXT, 0)]
    assert sorted(sorted(item["tags"]) for item in report["engines"]) == \
        sorted(sorted(tag for tag in tags if tag.startswith(f"r{release}")) for release in RELEASES)
    assert {item["result"] for item in report["flavours"]} == {"pushed"}
    assert f"[engine 2 ({CONTEXT})] ship [" in result.stderr + result.stdout
    one_engine = json.loads((project.root / "published.json").read_text(encoding="utf-8"))["flavours"]
    both = json.loads(published.read_text(encoding="utf-8"))["flavours"]
    assert {tag: both[tag]["digest"] for tag in tags} == {tag: one_engine[tag]["digest"] for tag in tags}
    assert all(both[tag]["registry"] == split for tag in tags)
