"""`python -m xla_ext.check`: run the extension's function and operator on the XLA device; exit 1 if wrong."""
import sys

import torch
import torch_xla

import xla_ext


def xla_device() -> torch.device:
    if hasattr(torch_xla, "device"):  # 2.7+: torch_xla.device(); before, torch_xla.core.xla_model.xla_device()
        return torch_xla.device()
    import torch_xla.core.xla_model as xm

    return xm.xla_device()


def main() -> int:
    device = xla_device()
    a = torch.arange(4, dtype=torch.float32, device=device)
    b = torch.full((4,), 2.0, device=device)
    c = torch.ones(4, device=device)
    added = xla_ext.scaled_add(a, b, 0.5).cpu()
    fused = xla_ext.mul_add(a, b, c).cpu()
    print(f"torch {torch.__version__} torch_xla {torch_xla.__version__} on {device}")
    print(f"scaled_add: {added.tolist()}  mul_add: {fused.tolist()}  describe: {xla_ext.describe(a.cpu())}")
    expected_added, expected_fused = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 5.0, 7.0]
    if added.tolist() != expected_added or fused.tolist() != expected_fused:
        print(f"wrong: expected {expected_added} and {expected_fused}", file=sys.stderr)
        return 1
    print("xla_ext: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
