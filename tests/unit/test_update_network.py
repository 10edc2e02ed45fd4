"""`build.py update` against the real package index: with 2.9.0 removed from a copy of matrix.yaml, `update --write`
restores it (its companions too) from the index alone, and `update --check` fails before and passes after.

Range requests only (a few hundred KB): seconds. Without the network the test is skipped on a developer's machine
and fails under CI, where the index is reachable (like test_wheels_network.py).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xla_images import yamlsrc
from xla_images.generate.plan import load_plan
from xla_images.model import wheel_index

ROOT = Path(__file__).resolve().parents[2]
CA = "/etc/ssl/certs/ca-certificates.crt"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    if Path(CA).is_file():
        environment.setdefault("SSL_CERT_FILE", CA)  # behind a TLS-intercepting proxy: ca_bundle `auto` reads it
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args, "--matrix", str(cwd / "matrix.yaml")],
                          cwd=cwd, capture_output=True, text=True, env=environment, timeout=300)


def without_2_9_0(text: str) -> str:
    text = re.sub(r'(?m)^  "2\.9\.0":\n(    .*\n)+', "", text)
    return re.sub(r'(?m)^  # [^\n]*\n(?=  - \{torch_xla: "2\.9\.0")', "", text).replace(
        '  - {torch_xla: "2.9.0", python: "3.13", accelerator: tpu}\n', "")


def test_update_restores_2_9_0_from_the_index(tmp_path: Path) -> None:
    original = (ROOT / "matrix.yaml").read_text()
    (tmp_path / "matrix.yaml").write_text(without_2_9_0(original))
    assert '"2.9.0"' not in (tmp_path / "matrix.yaml").read_text()
    started = time.monotonic()
    before = run("update", "--check", cwd=tmp_path)
    if before.returncode != 1 and "index-network" in before.stderr and not os.environ.get("CI"):
        pytest.skip(f"the package index is not reachable here: {before.stderr[-300:]}")
    assert before.returncode == 1 and "[update-behind]" in before.stderr, before.stdout + before.stderr
    written = run("update", "--write", cwd=tmp_path)
    assert written.returncode == 0, written.stdout + written.stderr
    after = run("update", "--check", cwd=tmp_path)
    assert after.returncode == 0, after.stdout + after.stderr
    seconds = time.monotonic() - started

    doc = yamlsrc.load(tmp_path / "matrix.yaml")
    release = doc.data["releases"]["2.9.0"]
    assert (release["torch"], release["libtpu"], release["python_support"]) == ("2.9.0", "0.0.21", ">=3.10,<3.14")
    # The companions whose METADATA pins torch 2.9.0 (issue 33), in the constraints of every 2.9.0 flavour.
    assert (release["torchvision"], release["torchaudio"]) == ("0.24.0", "2.9.0")
    constraints = (tmp_path / "Dockerfiles" / "r2.9.0_3.11_cpu" / "constraints.txt").read_text().splitlines()
    assert "torchvision==0.24.0" in constraints and "torchaudio==2.9.0" in constraints
    plan = load_plan(tmp_path / "matrix.yaml")  # validates, wheel-python included
    tags = {flavour.tag for flavour in plan.flavours if flavour.torch_xla == "2.9.0"}
    assert {f"r2.9.0_{python}_cpu" for python in ("3.10", "3.11", "3.12", "3.13")} <= tags
    assert {f"r2.9.0_{python}_tpuvm" for python in ("3.10", "3.11", "3.12")} <= tags
    assert "r2.9.0_3.13_tpuvm" not in tags
    # Every line the user wrote is still there, in order.
    lines = iter((tmp_path / "matrix.yaml").read_text().splitlines())
    assert all(line in lines for line in without_2_9_0(original).splitlines())
    cache = wheel_index.load(tmp_path / wheel_index.WHEELS_FILE)
    assert cache is not None and cache.pythons("libtpu", "0.0.21") == ("3.10", "3.11", "3.12")
    assert (tmp_path / "Dockerfiles" / "r2.9.0_3.11_cpu" / "Dockerfile").is_file()  # rendered
    print(f"update --check, --write, --check against the index: {seconds:.1f}s")
    shutil.rmtree(tmp_path / "Dockerfiles")
