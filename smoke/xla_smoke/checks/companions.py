"""torchvision / torchaudio: a companion the image installs imports and runs one real op on the XLA device.

The image names what it installs in $XLA_IMAGES_COMPANIONS (`torchvision==0.24.0 torchaudio==2.9.0`, matrix.yaml
`companions:`). A companion named there must import at that version and compute the same result on the XLA
device as on the CPU; one installed although not named (a derived image's `pip install torchvision`) is checked
the same way; one neither named nor installed is skipped. An import that fails is a failure, never a skip, when
the package is installed: the classic cause is an extension built for another torch or ABI (undefined symbol).

The ops: torchvision.ops.nms (torchvision's own C++ kernel, reached from the XLA device through torch_xla's CPU
fallback) and a resize transform (plain torch ops, traced into an XLA graph); torchaudio.functional's
compute_deltas and an amplitude-to-dB (plain torch ops).
"""
from __future__ import annotations

import importlib.metadata
import os
from typing import Any, Callable, Optional

import torch

from xla_smoke import compat
from xla_smoke.context import Context
from xla_smoke.expectations import ENV_PREFIX, version_matches
from xla_smoke.numerics import mismatch
from xla_smoke.report import Outcome, failed, skipped, verdict

COMPANIONS_VAR = ENV_PREFIX + "COMPANIONS"
SEED = 7
RTOL = 1e-4
ATOL = 1e-4


def expected_companions(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """{name: version} the image says it installs ($XLA_IMAGES_COMPANIONS, `name==version` words)."""
    text = (os.environ if environ is None else environ).get(COMPANIONS_VAR, "")
    pins = {}
    for word in text.split():
        name, _, version = word.partition("==")
        pins[name] = version
    return pins


def installed_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_torchvision(context: Context) -> Outcome:
    return _check("torchvision", _torchvision_ops)


def run_torchaudio(context: Context) -> Outcome:
    return _check("torchaudio", _torchaudio_ops)


def _check(name: str, ops: Callable[[Any, torch.device], list[str]]) -> Outcome:
    expected = expected_companions().get(name)
    installed = installed_version(name)
    if installed is None and expected is None:
        return skipped(f"{name} is not installed (the image installs no companions: {COMPANIONS_VAR} is unset)")
    if installed is None:
        return failed(f"the image installs {name} {expected} (${COMPANIONS_VAR}), but it is not installed")
    if expected and not version_matches(expected, installed):
        return failed(f"{name} is {installed}, the image installs {expected}", installed=installed)
    try:
        module = __import__(name)
    except Exception as exc:  # noqa: BLE001 - an ImportError, or an OSError naming an undefined symbol
        return failed(f"{name} {installed} is installed but does not import: {type(exc).__name__}: {exc}",
                      installed=installed)
    try:
        problems = ops(module, compat.device())
    except Exception as exc:  # noqa: BLE001 - e.g. no kernel for the op on this backend
        return failed(f"{name} {installed}: the op failed on the XLA device: {type(exc).__name__}: {exc}",
                      installed=installed)
    return verdict(problems, f"{name} {installed} imports and its op on the XLA device equals the CPU's",
                   installed=installed)


def _torchvision_ops(torchvision: Any, device: torch.device) -> list[str]:
    from torchvision.transforms import v2

    generator = torch.Generator().manual_seed(SEED)
    corners = torch.rand(32, 2, generator=generator) * 100
    boxes = torch.cat([corners, corners + 1 + torch.rand(32, 2, generator=generator) * 40], dim=1)
    scores = torch.rand(32, generator=generator)
    expected = torchvision.ops.nms(boxes, scores, 0.5)
    kept = torchvision.ops.nms(boxes.to(device), scores.to(device), 0.5)
    compat.sync()
    problems = []
    if not torch.equal(kept.cpu(), expected):
        problems.append(f"nms kept {kept.cpu().tolist()} on the XLA device, {expected.tolist()} on the CPU")
    images = torch.rand(2, 3, 32, 48, generator=generator)
    resize = v2.Resize((16, 24), antialias=False)
    problems += _compare("Resize", resize(images.to(device)), resize(images))
    return problems


def _torchaudio_ops(torchaudio: Any, device: torch.device) -> list[str]:
    functional = torchaudio.functional
    generator = torch.Generator().manual_seed(SEED)
    spectrogram = torch.rand(2, 40, 100, generator=generator) + 1e-3
    problems = _compare("compute_deltas", functional.compute_deltas(spectrogram.to(device)),
                        functional.compute_deltas(spectrogram))
    problems += _compare("amplitude_to_DB", functional.amplitude_to_DB(spectrogram.to(device), 10.0, 1e-10, 0.0, 80.0),
                         functional.amplitude_to_DB(spectrogram, 10.0, 1e-10, 0.0, 80.0))
    return problems


def _compare(what: str, on_device: torch.Tensor, on_cpu: torch.Tensor) -> list[str]:
    compat.sync()
    found = mismatch(what, on_cpu, on_device, rtol=RTOL, atol=ATOL)
    return [found] if found else []
