"""The example extension: `scaled_add` and `describe` (pybind11) and `torch.ops.xla_ext.mul_add` (TORCH_LIBRARY)."""
import torch  # first: the extension links libtorch, and its operator registers with torch's dispatcher

from . import _C

scaled_add = _C.scaled_add
describe = _C.describe


def mul_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.ops.xla_ext.mul_add(a, b, c)
