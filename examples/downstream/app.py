"""A tiny downstream app: one computation on the XLA device of the base image (PJRT CPU unless on a TPU)."""
from __future__ import annotations

import os

import torch
import torch_xla


def main() -> None:
    device = torch_xla.device()
    weights = torch.full((4, 4), 0.5, device=device)
    inputs = torch.ones(2, 4, device=device)
    total = (inputs @ weights).sum().item()
    print(f"downstream app: torch {torch.__version__}, torch_xla {torch_xla.__version__}, "
          f"cxx11 ABI {torch._C._GLIBCXX_USE_CXX11_ABI}, image {os.environ.get('XLA_IMAGES_TAG', '?')}, "
          f"PJRT {os.environ.get('PJRT_DEVICE', '?')}, result {total:.1f}")


if __name__ == "__main__":
    main()
