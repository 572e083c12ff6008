// tests/cuda/main.cpp - doctest main of the GPU tests: exits 77 (SKIP for meson)
// where no CUDA device can be used, so CI without a GPU reports them skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <gmlake/backend/cuda_vmm.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (!gmlake::backend::cuda_vmm::available()) {
    std::printf("SKIP: no usable CUDA device: %s\n", gmlake::backend::cuda_vmm::unavailable_reason().c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
