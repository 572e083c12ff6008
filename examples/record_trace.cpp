// examples/record_trace.cpp - record what a C++ program allocates, to see what
// gmlake would save on it. A toy training loop (weights; per step, activations for
// a sequence length that changes every step, their gradients, and a cache that
// grows by push_back) allocates through a std::pmr view of a recording_allocator
// over gmlake on the host backend. It writes a trace that gmlake-replay reads and
// prints the memory summary.
//
//   build/examples/record_trace [OUT.trace.gz]     (default: record_trace.trace.gz)
//   build/bench/gmlake-replay OUT.trace.gz         (the same peak live bytes)
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

#include <cstdio>
#include <memory_resource>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "record_trace.trace.gz";
  gmlake::allocator<gmlake::backend::host_memfd> gm(gmlake::backend::host_memfd(std::size_t{512} << 20));
  gmlake::recording_allocator rec(gm, out, "example-record_trace");
  gmlake::memory_resource mr(rec);  // containers allocate through the recorder

  constexpr std::size_t layers = 6, hidden = 512;
  std::mt19937 rng(7);
  double checksum = 0;
  {
    std::pmr::vector<std::pmr::vector<float>> weights(&mr);
    for (std::size_t l = 0; l < layers; ++l) weights.emplace_back(hidden * hidden, 0.01f * static_cast<float>(l));
    std::pmr::vector<float> cache(&mr);
    for (unsigned step = 0; step < 8; ++step) {
      rec.mark_iteration(step);
      const std::size_t seq = 64 + rng() % 448;
      std::pmr::vector<std::pmr::vector<float>> acts(&mr);  // forward: one activation per layer
      for (std::size_t l = 0; l < layers; ++l) acts.emplace_back(seq * hidden, 1.0f + static_cast<float>(l));
      for (std::size_t l = layers; l-- > 0;) {              // backward: a gradient per layer, then drop it
        std::pmr::vector<float> grad(2 * seq * hidden, 0.5f, &mr);
        checksum += grad[seq] * acts[l][seq] * weights[l][l];
        acts.pop_back();
      }
      for (std::size_t i = 0; i < seq * 64; ++i) cache.push_back(static_cast<float>(i));
    }
  }
  std::fputs(rec.summary().c_str(), stdout);
  std::printf("peak live bytes (as gmlake-replay counts them): %llu\n",
              static_cast<unsigned long long>(rec.peak_live_bytes()));
  const bool ok = rec.close() && gm.stats().allocations.current == 0 && checksum > 0;
  std::printf("trace written to %s: %s\n", out.c_str(), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
