// tests/cuda/kernels.hpp - small CUDA kernels the GPU tests launch (kernels.cu).
// Plain functions, so the tests themselves compile with the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gmlake_gpu {

/// The byte a pattern with `seed` has at offset i.
constexpr unsigned char pattern(std::uint32_t seed, std::size_t i) {
  return static_cast<unsigned char>(((seed * 2654435761u) ^ (static_cast<std::uint32_t>(i) * 40503u) ^
                                     static_cast<std::uint32_t>(i >> 13)) >> 3);
}

/// Writes pattern(seed, i) to p[i], i < n, on stream s.
cudaError_t fill(void* p, std::size_t n, std::uint32_t seed, cudaStream_t s);

/// Counts i < n with p[i] != pattern(seed, i), on stream s; waits for the result.
/// Returns SIZE_MAX on a CUDA error.
std::size_t mismatches(const void* p, std::size_t n, std::uint32_t seed, cudaStream_t s);

/// Spins for about `ns` nanoseconds on the GPU, then fills as fill() does.
cudaError_t spin_then_fill(void* p, std::size_t n, std::uint32_t seed, std::uint64_t ns, cudaStream_t s);

} // namespace gmlake_gpu
