// bench/probe.hpp - what the driver probes in bench/ share: a check that counts
// and prints failing driver calls, and a microsecond clock. Header-only, for
// single-file nvcc builds (`nvcc ... bench/NAME.cu -lcuda`).
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdio>

namespace probe {
inline int failures = 0;
inline void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = "";
  cuGetErrorString(r, &s);
  std::printf("FAIL %s -> %d %s\n", what, static_cast<int>(r), s);
  ++failures;
}
using clock_type = std::chrono::steady_clock;
inline double us_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t).count();
}
}  // namespace probe

#define CK(x) ::probe::check((x), #x)
