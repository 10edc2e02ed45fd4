"""`run-spec`: the docker arguments and Kubernetes Jobs it prints, and how it names the image."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

from pod_security import K8S_VERSION, violations
from xla_images.cli.run_spec import job_name
from xla_images.generate.plan import load_plan
from xla_images.model import running
from xla_images.model.published import Published
from xla_images.run.shipping import publish

ROOT = Path(__file__).resolve().parents[2]
CPU, TPU = "r2.9.0_3.11_cpu", "r2.9.0_3.11_tpuvm"
DIGEST = "sha256:" + "d" * 64


def run_spec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "run-spec", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def body(output: str) -> tuple[str, str]:
    """(the comment line saying how the image is named, the rest)."""
    first, _, rest = output.partition("\n")
    assert first.startswith("# "), output
    return first, rest


def test_docker_cpu_is_the_restricted_profile_by_tag() -> None:
    result = run_spec(CPU)
    assert result.returncode == 0, result.stderr
    comment, command = body(result.stdout)
    assert "restricted profile" in comment and "image by tag" in comment
    words = shlex.split(command)
    image = f"{load_plan(ROOT / 'matrix.yaml').site.registry}:{CPU}"
    assert words[:3] == ["docker", "run", "--rm"]
    assert words[3:3 + len(running.docker_args(running.restricted_profile()))] == running.docker_args(
        running.restricted_profile())
    assert words[words.index(image) + 1:] == list(running.SMOKE_COMMAND)


def test_docker_tpu_is_the_tpu_vm_profile() -> None:
    result = run_spec(TPU, "--command", "python -c 'import torch_xla'")
    assert result.returncode == 0, result.stderr
    words = shlex.split(body(result.stdout)[1])
    for flag in ("--privileged", "PJRT_DEVICE=TPU", "16G"):
        assert flag in words
    assert words[words.index("--network") + 1] == "host"
    assert words[-3:] == ["python", "-c", "import torch_xla"]


def test_kubernetes_jobs_are_valid_and_the_cpu_one_restricted(tmp_path: Path) -> None:
    for tag in (CPU, TPU):
        result = run_spec(tag, "--format", "kubernetes", "--topology", "2x2x1", "--tpu-accelerator", "tpu-v4-podslice")
        assert result.returncode == 0, result.stderr
        job = yaml.safe_load(body(result.stdout)[1])
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
        assert job["metadata"]["name"] == job_name(tag)
        pod = job["spec"]["template"]["spec"]
        if tag == CPU:
            assert violations(job) == []
        else:
            assert pod["nodeSelector"][running.GKE_TPU_TOPOLOGY] == "2x2x1"
            assert pod["nodeSelector"][running.GKE_TPU_ACCELERATOR] == "tpu-v4-podslice"


def test_a_published_tag_is_named_by_digest(tmp_path: Path) -> None:
    flavour = next(f for f in load_plan(ROOT / "matrix.yaml").flavours if f.tag == CPU)
    path = tmp_path / "published.json"
    publish.record_published(path, [Published(CPU, flavour.tags, "registry.example:5000/xla", DIGEST, {},
                                              flavour.to_json(), "now")])
    result = run_spec(CPU, "--published", str(path), "--format", "kubernetes")
    assert result.returncode == 0, result.stderr
    comment, rest = body(result.stdout)
    assert "by digest" in comment
    image = yaml.safe_load(rest)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry.example:5000/xla@{DIGEST}"


def test_bad_input_exits_2() -> None:
    assert run_spec(CPU, "--topology", "2by2").returncode == 2
    assert run_spec("r0.0.0_nope").returncode == 2


def test_job_names_are_dns_labels() -> None:
    assert job_name("r2.9.0_3.11_cpu_cxx11") == "xla-r2-9-0-3-11-cpu-cxx11"
    assert len(job_name("r" + "9" * 100)) <= 63
