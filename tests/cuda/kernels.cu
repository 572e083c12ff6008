// tests/cuda/kernels.cu - the kernels of kernels.hpp.
#include "kernels.hpp"

#include <cstdint>

namespace gmlake_gpu {
namespace {

__device__ unsigned char device_pattern(std::uint32_t seed, std::size_t i) {
  return static_cast<unsigned char>(((seed * 2654435761u) ^ (static_cast<std::uint32_t>(i) * 40503u) ^
                                     static_cast<std::uint32_t>(i >> 13)) >> 3);
}

__global__ void fill_kernel(unsigned char* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = device_pattern(seed, i);
}

__global__ void check_kernel(const unsigned char* p, std::size_t n, std::uint32_t seed,
                             unsigned long long* bad) {
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    mine += p[i] != device_pattern(seed, i);
  if (mine) atomicAdd(bad, mine);
}

__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_fill_kernel(unsigned char* p, std::size_t n, std::uint32_t seed, std::uint64_t ns) {
  if (threadIdx.x == 0) {
    const std::uint64_t start = global_ns();
    while (global_ns() - start < ns) {
    }
  }
  __syncthreads();
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = device_pattern(seed, i);
}

unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1024 ? (blocks ? blocks : 1) : 1024);
}

} // namespace

cudaError_t fill(void* p, std::size_t n, std::uint32_t seed, cudaStream_t s) {
  fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<unsigned char*>(p), n, seed);
  return cudaGetLastError();
}

std::size_t mismatches(const void* p, std::size_t n, std::uint32_t seed, cudaStream_t s) {
  unsigned long long* bad = nullptr;
  if (cudaMallocHost(&bad, sizeof *bad) != cudaSuccess) return SIZE_MAX;
  *bad = 0;
  check_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const unsigned char*>(p), n, seed, bad);
  std::size_t r = SIZE_MAX;
  if (cudaGetLastError() == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess) r = static_cast<std::size_t>(*bad);
  cudaFreeHost(bad);
  return r;
}

cudaError_t spin_then_fill(void* p, std::size_t n, std::uint32_t seed, std::uint64_t ns, cudaStream_t s) {
  // One block: the spin must delay every write, and the kernel must stay short of
  // the device, so that work queued on other streams runs beside it.
  spin_fill_kernel<<<1, 256, 0, s>>>(static_cast<unsigned char*>(p), n, seed, ns);
  return cudaGetLastError();
}

} // namespace gmlake_gpu
