"""Builds and installs gmlake_torch (the Python module) and _gmlake_torch (the C++
extension that makes gmlake PyTorch's own CUDA allocator) against the torch that
is installed:

    pip install --no-build-isolation ./examples/torch

--no-build-isolation builds against the installed torch (no package index is
needed). Boost's headers (Boost.Intrusive) must be on the compiler's path, as for
every gmlake program (Debian: libboost-dev; elsewhere set CPATH).
"""
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.normpath(os.path.join(HERE, "..", "..", "include"))

setup(
    name="gmlake_torch",
    version="0.1.0",
    description="gmlake (GPU memory stitching) as PyTorch's CUDA allocator",
    py_modules=["gmlake_torch"],
    ext_modules=[
        CUDAExtension(
            "_gmlake_torch",
            ["native.cpp"],
            include_dirs=[INCLUDE],
            extra_compile_args={"cxx": ["-std=c++20", "-O2", "-DGMLAKE_DEBUG=0"]},
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
