"""A made-up flavour for unit tests that need one without a matrix: r2.9.0_3.11_cpu with its aliases and an
id, every fact replaceable by keyword (test_publish.py, test_resolve.py)."""
from __future__ import annotations

from typing import Any

from xla_images.model.flavour import Abi, Accelerator
from xla_images.model.site import WheelSource
from xla_images.model.target import Target


def make_flavour(**changes: Any) -> Target:
    facts: dict[str, Any] = dict(
        torch_xla="2.9.0", torch="2.9.0", python="3.11", abi=Abi.CXX11, accelerator=Accelerator.CPU, libtpu=None,
        release_default_abi=Abi.CXX11, pytorch_git_rev="v2.9.1", xla_git_rev="v2.9.0",
        wheel_source=WheelSource("default"), base_image="python:3.11-slim-bookworm", declared_at="matrix.yaml:1",
        aliases=("r2.9_3.11_cpu", "latest_cpu"), id="sha256:" + "1" * 64)
    facts.update(changes)
    return Target(**facts)
