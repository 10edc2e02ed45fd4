"""What the lifecycle tests share: a matrix with a release and a nightly, the wheel sources that serve both
(test_nightly.py, test_promote.py), and made-up digests (test_prune.py, test_promote.py)."""
from __future__ import annotations

import textwrap

from xla_images import yamlsrc
from xla_images.model.matrix import expand
from xla_images.model.site import load_site
from xla_images.model.target import bind
from support.matrices import RELEASE_2_9_0

NIGHTLY = """\
schema: 1
defaults:
  pythons: ["3.11"]
  accelerators: [tpu, cpu]
  latest_python: "3.11"
releases:
""" + RELEASE_2_9_0 + """\
  "2.10.0":
    channel: nightly
    torch: "2.10.0"
    pytorch_git_rev: nightly
    xla_git_rev: master
    python_support: ">=3.10,<3.14"
    libtpu: "0.0.21"
"""
NIGHTLY_SOURCE = ("wheel_sources=[{name: nightly, match: {channel: nightly}, find_links: "
                  "[https://wheels.example/nightly]}, {name: default, match: {torch_xla: '>=2.7', abi: cxx11}}]")


def flavours(text: str = NIGHTLY, overrides: tuple[str, ...] = (NIGHTLY_SOURCE,)):
    return bind(expand(yamlsrc.loads(textwrap.dedent(text), "m.yaml")), load_site(None, overrides))


def digest(n: int) -> str:
    return f"sha256:{n:064x}"
