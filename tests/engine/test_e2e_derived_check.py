"""`xla-images-check` against reality, on derived images of the real r2.9.0_3.11_cpu (issue #42).

Users' derived images install extension packages from the index. Whether such a package works is a fact we can
observe in the same image: import it after torch and run one of its ops. The check must exit 0 exactly when that
works, and 1 when it does not:

* fbgemm-gpu-cpu 1.4.2 (built for torch 2.9): its op runs; the old static check failed it ("version mismatch");
* fbgemm-gpu-cpu 1.3.0 (`--no-deps`, built for torch 2.8): python dies on import (std::bad_alloc / SIGSEGV);
* fbgemm-gpu-cpu 1.5.0 (`--no-deps`, built for torch 2.10): import fails (its library does not load);
* torchao 0.14.1 (built for torch 2.9): works; it also ships a cp310 CUDA prototype .so that nothing imports, which
  the old check failed on.

One build context, one Dockerfile, a stage per package: the stages share the image and the tool layer, and each is
a few MB. The tool is this checkout's zipapp copied over the image's (it is the image's own when the image is up to
date; the image is built only when it is not, as the end to end test builds it). The proxy's CA is a BuildKit
secret mounted for pip only.

Cost (2026-12-07, image up to date, 2 cores at load average ~9 shared with other work): 184 s — the four derived
stages 119 s (most of it pip fetching the wheels), then per stage the op and the check (12-18 s). Its file name
puts it after test_devel_real (which leaves the runtime image up to date) and before the end to end (whose clean-up
removes the image's names), so it never builds the image in CI.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from reporters import QuietReporter
from xla_images import names
from xla_images.errors import Failure
from xla_images.generate.plan import load_plan
from xla_images.run import engine
from xla_images.run.building import build
from xla_images.run.building.check_tool import write_check_tool

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TAG = "r2.9.0_3.11_cpu"
CPU = {"PJRT_DEVICE": "CPU"}
FBGEMM_OP = ("import torch, fbgemm_gpu\n"
             "assert torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 2, 3])).tolist() == [0, 1, 3, 6]\n")
TORCHAO_OP = ("import torch\nfrom torchao.quantization import quantize_, Int8WeightOnlyConfig\n"
              "model = torch.nn.Sequential(torch.nn.Linear(32, 32))\nquantize_(model, Int8WeightOnlyConfig())\n"
              "assert model(torch.randn(2, 32)).shape == (2, 32)\n")
# stage -> (pip install arguments, the program that is reality, whether it works: what the index holds today)
CASES = {
    "fbgemm142": ("fbgemm-gpu-cpu==1.4.2", FBGEMM_OP, True),
    "fbgemm130": ("--no-deps fbgemm-gpu-cpu==1.3.0", FBGEMM_OP, False),
    "fbgemm150": ("--no-deps fbgemm-gpu-cpu==1.5.0", FBGEMM_OP, False),
    "torchao0141": ("torchao==0.14.1", TORCHAO_OP, True),
}


def dockerfile() -> str:
    lines = ["ARG BASE", "FROM ${BASE} AS checked", f"COPY xla-images-check {names.IMAGE_CHECK_TOOL}"]
    for stage, (install, _, _) in CASES.items():
        lines += [f"FROM checked AS {stage}",
                  "RUN --mount=type=secret,id=ca.crt,target=/tmp/proxy-ca.crt PIP_CERT=/tmp/proxy-ca.crt "
                  f"pip install --no-cache-dir {install}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def derived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """stage -> image id, every stage of one context built FROM the real image."""
    plan = load_plan(REPO / "matrix.yaml")
    (flavour,) = plan.select((TAG,))
    started = time.monotonic()
    (result,) = build.build_flavours(plan, [flavour], build.BuildOptions(prune_cache=True), QuietReporter())
    assert result.outcome in (build.Outcome.BUILT, build.Outcome.SKIPPED), result.message
    print(f"[image-check] {TAG}: {result.outcome.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    context = tmp_path_factory.mktemp("derived")
    (context / "Dockerfile").write_text(dockerfile())
    write_check_tool(context / "xla-images-check")
    ca = plan.site.ca_bundle()
    assert ca is not None, "derived builds reach the index through this host's proxy: name its CA (PIP_CERT)"
    export = plan.site.compression if engine.connection.image_store() == "containerd" else None
    images: dict[str, str] = {}
    try:
        for stage in CASES:
            started, lines = time.monotonic(), []
            try:
                images[stage] = engine.buildkit.BuildKitBuild(
                    context, {"BASE": names.local_ref(TAG)}, target=stage, secrets={"ca.crt": Path(ca)},
                    export=export).run(lines.append)
            except Failure as error:
                pytest.fail(f"the derived build {stage} failed: {error.message}\n" + "\n".join(lines[-30:]))
            print(f"[image-check] derived {stage}: {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield images
    finally:
        for image in images.values():
            engine.images.remove_if_unnamed(image)


def run(image: str, command: list[str]) -> engine.containers.ContainerRun:
    return engine.containers.run_container(image, command, role="image-check-test",
                                           options=engine.containers.RunOptions(environment=CPU), timeout=900)


@pytest.mark.parametrize("stage", list(CASES))
def test_the_check_exits_as_reality_does(derived: dict[str, str], stage: str) -> None:
    install, program, works = CASES[stage]
    reality = run(derived[stage], ["python", "-c", program])
    assert (reality.exit_code == 0) is works, (
        f"the index changed: `pip install {install}` then the op exited {reality.exit_code}: "
        f"{reality.output[-1500:]}")
    started = time.monotonic()
    checked = run(derived[stage], [names.CHECK_TOOL, "--json"])
    seconds = time.monotonic() - started
    print(f"[image-check] {stage}: reality {reality.exit_code}, check {checked.exit_code} in {seconds:.1f} s\n"
          f"{checked.output[-3000:]}", file=sys.stderr)
    assert checked.exit_code == (0 if works else 1), checked.output[-3000:]
    assert "Traceback" not in checked.output
    report = json.loads(checked.output[checked.output.index("{"):])
    assert "not called" in report["imports"]["exercised"]  # it says what it did not exercise
    if works:
        assert report["ok"] and {"torch", "torch_xla"} <= set(report["imports"]["imported"]), report
    else:
        (problem,) = [problem for problem in report["problems"] if problem["kind"] == "import"]
        assert problem["message"].startswith("`import fbgemm_gpu`"), report["problems"]
    if stage == "torchao0141":  # its CUDA prototype for python 3.10: nothing imports it, so it is information
        assert any(path.startswith("torchao/") and "cpython-310" in path
                   for path in report["information"]["not_loaded"]), report["information"]
