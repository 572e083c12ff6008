// examples/cuda_pmr.cu - gmlake on a GPU through std::pmr: fragment the memory,
// get a buffer the free pieces can only serve stitched together, and run a kernel
// over it.
//
//   build/examples/cuda_pmr        (exits 77 where there is no GPU)
#include <gmlake/backend/cuda_vmm.hpp>
#include <gmlake/gmlake.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <memory_resource>
#include <vector>

__global__ void saxpy(float a, const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = a * x[i] + y[i];
}

__global__ void iota(float* p, std::size_t n, float scale) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = scale * static_cast<float>(i % 1024);
}

int main() {
  using gmlake::backend::cuda_vmm;
  if (!cuda_vmm::available()) {
    std::printf("no CUDA device: %s\n", cuda_vmm::unavailable_reason().c_str());
    return 77;
  }
  gmlake::allocator<cuda_vmm> a{cuda_vmm(0)};
  gmlake::memory_resource gpu(a);  // a std::pmr view of `a`, on the default stream
  std::pmr::polymorphic_allocator<float> alloc(&gpu);
  const std::size_t chunk = gpu.allocator().chunk_size() / sizeof(float);  // floats per physical chunk

  // Eight chunk-sized buffers side by side; free every other one: four free chunks, none adjacent.
  std::vector<float*> bufs;
  for (int i = 0; i < 8; ++i) bufs.push_back(alloc.allocate(chunk));
  for (int i = 0; i < 8; i += 2) alloc.deallocate(bufs[i], chunk);

  // Two buffers of two chunks each: served by stitching the free chunks, no new memory.
  const auto before = gpu.allocator().stats();
  const std::size_t n = 2 * chunk;
  float* x = alloc.allocate(n);
  float* y = alloc.allocate(n);
  const auto after = gpu.allocator().stats();

  iota<<<256, 256>>>(x, n, 1.0f);
  iota<<<256, 256>>>(y, n, 0.5f);
  saxpy<<<256, 256>>>(2.0f, x, y, n);
  std::vector<float> host(n);
  cudaMemcpy(host.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += host[i] != 2.5f * static_cast<float>(i % 1024);

  std::printf("stitched requests: %llu, new physical bytes: %lld, stitched blocks mapped: %lld\n",
              static_cast<unsigned long long>(after.fit[2] - before.fit[2]),
              static_cast<long long>(after.reserved_bytes.current - before.reserved_bytes.current),
              static_cast<long long>(after.stitched_blocks.current));
  std::printf("saxpy over stitched memory: %zu of %zu values wrong\n", wrong, n);

  alloc.deallocate(x, n);
  alloc.deallocate(y, n);
  for (int i = 1; i < 8; i += 2) alloc.deallocate(bufs[i], chunk);
  return wrong == 0 && cudaGetLastError() == cudaSuccess ? 0 : 1;
}
