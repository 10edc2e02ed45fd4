"""benchmarks/abi_mixes.py loaded once for the xla tests (it is a script, not a package): its compiled helper
layouts and `mirror`, shared by test_abi_ground_truth.py and test_abi_torch.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("abi_mixes", Path(__file__).resolve().parents[2] / "benchmarks" /
                                               "abi_mixes.py")
abi_mixes = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("abi_mixes", abi_mixes)  # dataclasses look their module up by name
_SPEC.loader.exec_module(abi_mixes)
mirror = abi_mixes.mirror  # hard-linked copies: check does not follow directory links out of its tree
