// examples/cuda_pmr.cu - gmlake on a GPU through std::pmr: fragment the memory,
// get buffers the free pieces can only serve stitched together, and run a kernel
// over them.
//
//   build/examples/cuda_pmr        (exits 77 where there is no GPU; 1 if nothing
//                                   was stitched or a value came out wrong)
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
  const auto& lake = gpu.allocator();

  // A large request makes the allocator create physical memory in one step of at
  // least a growth floor (16 MiB by default), not just the chunk asked for; only free
  // handles that are wholly free can be stitched. So first measure that step.
  const std::size_t chunk = lake.chunk_size() / sizeof(float);  // floats per physical chunk
  float* probe = alloc.allocate(chunk);
  const std::size_t step = static_cast<std::size_t>(lake.stats().reserved_bytes.current) / sizeof(float);
  alloc.deallocate(probe, chunk);

  // Eight buffers of one step each, side by side, each on physical handles of its own;
  // free every other one: four free pieces, none adjacent to another.
  std::vector<float*> bufs;
  for (int i = 0; i < 8; ++i) bufs.push_back(alloc.allocate(step));
  for (int i = 0; i < 8; i += 2) alloc.deallocate(bufs[i], step);

  // Two buffers of two steps each: no free piece is large enough, so each is served by
  // stitching two free pieces into one new virtual range (state S3), no new memory.
  const auto before = lake.stats();
  const std::size_t n = 2 * step;
  float* x = alloc.allocate(n);
  float* y = alloc.allocate(n);
  const auto after = lake.stats();
  const auto s3 = static_cast<std::size_t>(gmlake::fit_state::s3_stitch);
  const auto stitched = after.fit[s3] - before.fit[s3];
  const auto new_bytes = after.reserved_bytes.current - before.reserved_bytes.current;

  iota<<<256, 256>>>(x, n, 1.0f);
  iota<<<256, 256>>>(y, n, 0.5f);
  saxpy<<<256, 256>>>(2.0f, x, y, n);
  std::vector<float> host(n);
  cudaMemcpy(host.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += host[i] != 2.5f * static_cast<float>(i % 1024);

  std::printf("step %zu MiB; stitched requests: %llu of 2, new physical bytes: %lld, stitched blocks mapped: %lld\n",
              step * sizeof(float) >> 20, static_cast<unsigned long long>(stitched),
              static_cast<long long>(new_bytes), static_cast<long long>(after.stitched_blocks.current));
  std::printf("saxpy over stitched memory: %zu of %zu values wrong\n", wrong, n);

  alloc.deallocate(x, n);
  alloc.deallocate(y, n);
  for (int i = 1; i < 8; i += 2) alloc.deallocate(bufs[i], step);
  const bool stitched_both = stitched == 2 && new_bytes == 0;
  if (!stitched_both) std::printf("FAIL: the two buffers were not both stitched from free memory\n");
  return stitched_both && wrong == 0 && cudaGetLastError() == cudaSuccess ? 0 : 1;
}
