"""The default suite, once, end to end: `python -m xla_smoke` as the image runs it (about two minutes)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch_xla")

import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402
from pathlib import Path  # noqa: E402

from xla_smoke.context import DEFAULT_LAYERS, DEFAULT_MIN_COMPILE_RATIO  # noqa: E402

SMOKE_DIR = Path(__file__).resolve().parents[2] / "smoke"


def image_environment() -> dict[str, str]:
    """The XLA_IMAGES_* variables an image of this venv's contents would carry."""
    import torch
    try:
        libtpu = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        libtpu = ""
    return {
        "XLA_IMAGES_TAG": "host-venv",
        "XLA_IMAGES_ABI": "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "pre-cxx11",
        "XLA_IMAGES_PYTHON": f"{sys.version_info.major}.{sys.version_info.minor}",
        "XLA_IMAGES_TORCH": importlib.metadata.version("torch").split("+")[0],
        "XLA_IMAGES_TORCH_XLA": importlib.metadata.version("torch_xla").split("+")[0],
        "XLA_IMAGES_LIBTPU": libtpu,
        "XLA_IMAGES_ACCELERATOR": "cpu",
    }


def test_default_suite_passes(tmp_path: Path) -> None:
    env = {**os.environ, **image_environment(), "PYTHONPATH": str(SMOKE_DIR), "PJRT_DEVICE": "CPU"}
    result = subprocess.run([sys.executable, "-m", "xla_smoke", "--report-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=900, env=env)
    report = json.loads((tmp_path / "report.json").read_text())
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    # The host's venv has no companions (XLA_IMAGES_COMPANIONS unset): skipped, not failed.
    companions = {name: "passed" if importlib.util.find_spec(name) else "skipped" for name in ("torchvision",
                                                                                               "torchaudio")}
    assert statuses == {"environment": "passed", "scan": "passed", "scan_layers": "passed",
                        "compile_time": "passed", "host_offload": "passed", "host_offload_exec": "skipped",
                        "tracing": "passed", **companions}, result.stdout
    assert result.returncode == 0, result.stderr

    metrics = report["metrics"]
    # The suite's default layer count is the headline, and the only point of the sweep.
    assert metrics["layers"] == max(DEFAULT_LAYERS)
    assert [point["layers"] for point in metrics["compile_sweep"]] == list(DEFAULT_LAYERS)
    assert metrics["compile_ratio"] >= DEFAULT_MIN_COMPILE_RATIO  # the check's own default margin
    assert metrics["trace_steps_per_s"] > 0
    tracing = next(check for check in report["checks"] if check["name"] == "tracing")
    assert len(tracing["metrics"]["repeats"]) == 7

    # The readable summary goes to stdout and names every check and the figures.
    for name in statuses:
        assert name in result.stdout
    assert "ratio" in result.stdout and "steps/s" in result.stdout
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(statuses)) and suite.get("failures") == "0"
