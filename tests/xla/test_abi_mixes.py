"""`abi check` against the real import on PyPI mixes of torch, torch_xla, torchvision and torchaudio.

Each mix is the host venv's site-packages (torch 2.9.0 + torch_xla 2.9.0, see ci/setup.sh) with distributions
replaced by other releases (`pip install --no-deps --target`, cached in $XLA_IMAGES_TEST_WHEELS). The prediction
must equal what a fresh python does: import, then call into each extension (an XLA computation,
`torchvision.ops.nms`, a torchaudio C++ operator); for a predicted mismatch the symbol the loader names must be
one `check` listed. The mixes and the machinery live in benchmarks/abi_mixes.py, which runs them all and prints
the table in docs/abi.md; CI runs the mixes marked `ci` (small downloads: torch_xla, torchvision and torchaudio
wheels, ~120 MB). Mixes needing another torch (~900 MB wheels each) run with XLA_IMAGES_ABI_MIXES=all.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("abi_mixes", REPO / "benchmarks" / "abi_mixes.py")
abi_mixes = importlib.util.module_from_spec(_spec)
sys.modules["abi_mixes"] = abi_mixes  # dataclasses look their module up by name
_spec.loader.exec_module(abi_mixes)

from xla_images import abi  # noqa: E402

ALL = os.environ.get("XLA_IMAGES_ABI_MIXES", "").lower() == "all"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MIXES = [mix for mix in abi_mixes.MIXES if mix.ci or ALL]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None,
                                reason=f"torch_xla is not importable by {sys.executable}")


@pytest.mark.parametrize("mix", MIXES, ids=[mix.name for mix in MIXES])
def test_check_predicts_the_real_import(mix, tmp_path: Path) -> None:
    try:
        outcome = abi_mixes.run_mix(mix, tmp_path)
    except RuntimeError as error:  # a wheel that cannot be downloaded here: in CI that is a failure
        if IN_CI:
            raise
        pytest.skip(str(error))
    assert outcome.agree, (f"{mix.name}: check predicted {outcome.predicted} ({outcome.summary}), "
                           f"the real import: {outcome.real}")


def test_the_ci_subset_holds_both_verdicts_and_every_kind_of_extension() -> None:
    """The subset stays representative: a neighbour torch_xla, torchvision and torchaudio built for the
    previous torch, and their matching controls."""
    ci = [mix for mix in abi_mixes.MIXES if mix.ci]
    probed = {package for mix in ci for package in mix.probes}
    assert probed == {"torch_xla", "torchvision", "torchaudio"}
    assert any("control" in mix.why for mix in ci) and any("control" not in mix.why for mix in ci)
    assert all(not requirement.startswith("torch==") for mix in ci for requirement in mix.replace)


def test_pinned_extension_for_another_torch_is_uncertain_with_its_reason(tmp_path: Path) -> None:
    """torchvision 0.23.0 resolves every symbol of torch 2.9.0 and still crashes at import: check says why. Since
    issue 42 it is `uncertain`, not a mismatch: other extensions pinned to another torch X.Y work
    (benchmarks/abi_corpus/truth.json)."""
    mix = next(mix for mix in abi_mixes.MIXES if "torchvision 0.23.0" in mix.name)
    try:
        view = abi_mixes.site_view(tmp_path / "site", abi_mixes.host_site(),
                                   [abi_mixes.overlay(requirement) for requirement in mix.replace])
    except RuntimeError as error:
        if IN_CI:
            raise
        pytest.skip(str(error))
    report = abi.check_site_packages(view)
    (extension,) = [item for item in report.extensions if item.path == "torchvision/_C.so"]
    assert extension.verdict == abi.UNCERTAIN and not extension.missing
    assert extension.requires_torch == "2.8.0" and extension.distribution == "torchvision 0.23.0"
    assert "requires torch==2.8.0" in report.summary and "symbols resolve" in report.summary
