"""The example extension's build: `pip wheel .` in an xla-images devel image (docs/derived.md).

The C++ ABI comes from the image's torch (cpp_extension reads torch._C._GLIBCXX_USE_CXX11_ABI): the same source
gives a pre-C++11 wheel in r2.6.0_*_devel and a C++11 one in r2.7.0+_devel. The devel image sets
PIP_NO_BUILD_ISOLATION=0, so pip builds against the image's torch instead of downloading one.
"""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="xla-ext-example",
    version="1.0.0",
    packages=["xla_ext"],
    ext_modules=[CppExtension("xla_ext._C", ["csrc/ext.cpp"])],
    cmdclass={"build_ext": BuildExtension},
)
