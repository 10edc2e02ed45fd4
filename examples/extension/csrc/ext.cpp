// The example extension (docs/derived.md): a plain function bound with pybind11 and an operator registered
// with TORCH_LIBRARY, built by `pip wheel .` in a devel image. No ABI flag here or in setup.py:
// torch.utils.cpp_extension passes -D_GLIBCXX_USE_CXX11_ABI=<torch._C._GLIBCXX_USE_CXX11_ABI>.
#include <torch/extension.h>

#include <string>

// A plain function: a + alpha * b.
torch::Tensor scaled_add(const torch::Tensor& a, const torch::Tensor& b, double alpha) {
  return a + alpha * b;
}

// A std::string from torch crosses the library boundary here, so the extension links a symbol whose name
// depends on the C++ ABI (at::TensorBase::toString[abi:cxx11]() in the C++11 one): built for the other ABI,
// it does not load.
std::string describe(const torch::Tensor& tensor) {
  return tensor.toString() + " of " + std::to_string(tensor.numel()) + " elements";
}

// The operator: a * b + c, composite so every backend (CPU, XLA) runs it through its own ops.
torch::Tensor mul_add(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
  return a * b + c;
}

TORCH_LIBRARY(xla_ext, m) {
  m.def("mul_add(Tensor a, Tensor b, Tensor c) -> Tensor");
}

TORCH_LIBRARY_IMPL(xla_ext, CompositeImplicitAutograd, m) {
  m.impl("mul_add", &mul_add);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scaled_add", &scaled_add, "a + alpha * b");
  m.def("describe", &describe, "the tensor's type and size");
}
