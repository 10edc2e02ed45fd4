"""Facts about the machine and the installed distributions that need no torch (standard library only)."""
from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
from typing import Optional

# Distributions that have shipped libtpu for torch_xla; the first one installed wins.
LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")
# TPU VMs expose the chips as /dev/accel* (v2-v4) or as VFIO groups (v5e and later).
TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")


def python_version() -> str:
    return platform.python_version()


def libtpu_version() -> Optional[str]:
    for name in LIBTPU_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def distribution_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def tpu_hardware_present() -> bool:
    return any(glob.glob(pattern) for pattern in TPU_DEVICE_GLOBS)


def default_pjrt_device() -> str:
    """What PJRT_DEVICE should be when the image did not say: the TPU if we can see one, else the CPU.

    Without it torch_xla probes for devices itself, and a CUDA build of torch_xla (the PyPI wheel) then
    warns or picks a backend this image does not target.
    """
    return "TPU" if tpu_hardware_present() else "CPU"


def pjrt_device() -> Optional[str]:
    return os.environ.get("PJRT_DEVICE")
