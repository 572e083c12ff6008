// tests/test_stress.cpp - 8 threads on one allocator (also run under TSan in CI).
//
// Each thread allocates and frees a mix of sizes (small arena, a few chunks, several
// chunks: stitching) on its own stream and the default one, keeps up to 24 blocks
// with a pattern in each (checked at its free on the real-memory backend), and
// thread 0 calls release_cached() now and then, thread 1 stats(); at the end
// everything is released and the invariants hold.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>
#include <doctest/doctest.h>

#include "support.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using gmlake::backend::host_memfd;
using gmlake::backend::simulated;

constexpr std::size_t kib = 1024;
constexpr std::size_t mib = kib * kib;
constexpr std::size_t C = 64 * kib;
constexpr std::size_t cap = 64 * mib;
constexpr int threads = 8;
constexpr int ops = 2000;

std::atomic<int> misuses{0};
void on_misuse(const char*, void*) { ++misuses; }

unsigned char pat(std::uint32_t seed, std::size_t k) {
  return static_cast<unsigned char>(((seed * 1000003u + k) * 2654435761u) >> 24);
}

template <class Alloc>
void run_stress(Alloc& a, bool real) {
  std::atomic<int> failures{0}, bad_data{0}, nulls{0};
  std::atomic<bool> go{false};
  auto worker = [&](int t) {
    std::mt19937 rng(1000u + static_cast<unsigned>(t));
    struct block {
      void* p;
      std::size_t n;
      std::uint32_t seed;
      std::uintptr_t stream;
    };
    std::vector<block> mine;
    // Writes / checks one byte every 256 and the last byte: cheap, and catches overlap.
    auto fill = [&](const block& b) {
      auto* c = static_cast<unsigned char*>(b.p);
      for (std::size_t i = 0; i < b.n; i += 256) c[i] = pat(b.seed, i);
      c[b.n - 1] = pat(b.seed, b.n - 1);
    };
    auto ok = [&](const block& b) {
      const auto* c = static_cast<const unsigned char*>(b.p);
      for (std::size_t i = 0; i < b.n; i += 256)
        if (c[i] != pat(b.seed, i)) return false;
      return c[b.n - 1] == pat(b.seed, b.n - 1);
    };
    auto free_one = [&] {
      const std::size_t k = rng() % mine.size();
      if (real && !ok(mine[k])) ++bad_data;
      a.deallocate(mine[k].p, mine[k].n, gmlake::host_stream{mine[k].stream});
      mine[k] = mine.back();
      mine.pop_back();
    };
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < ops; ++i) {
      if (!mine.empty() && (rng() % 100 < 45 || mine.size() > 24)) {
        free_one();
        continue;
      }
      std::size_t n;
      const unsigned r = rng() % 10;
      if (r < 5) n = 1 + rng() % (8 * kib);
      else if (r < 8) n = 8 * kib + rng() % C;
      else n = C + rng() % (2 * C);
      // Streams: mostly the thread's own, sometimes the default one.
      const std::uintptr_t stream = (rng() % 4 == 0) ? 0 : static_cast<std::uintptr_t>(t + 1);
      void* p = a.try_allocate(n, gmlake::host_stream{stream});
      if (p == nullptr) {
        ++nulls;
        if (!mine.empty()) free_one();
        continue;
      }
      if (reinterpret_cast<std::uintptr_t>(p) % 512 != 0) ++failures;
      const block b{p, n, static_cast<std::uint32_t>(t * 100000 + i), stream};
      if (real) fill(b);
      mine.push_back(b);
      if (t == 0 && i % 250 == 249) (void)a.release_cached();
      if (t == 1 && i % 400 == 399) {
        const auto s = a.stats();
        if (s.allocations.current < 0 || s.active_bytes.current > s.reserved_bytes.current + s.mapped_bytes.current)
          ++failures;
      }
    }
    while (!mine.empty()) free_one();
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  go = true;
  for (auto& th : pool) th.join();
  CHECK(failures == 0);
  CHECK(bad_data == 0);
  CHECK(nulls < threads * ops / 20);  // 64 MiB is plenty for 8 x 24 blocks of <= 3 chunks
  const auto s = a.stats();
  std::printf("[stress] %d threads x %d operations: %llu allocations (%llu stitched, %llu from the stitch cache), "
              "%llu failed (out of memory)\n",
              threads, ops, (unsigned long long)s.allocations.allocated,
              (unsigned long long)s.fit[static_cast<std::size_t>(gmlake::fit_state::s3_stitch)],
              (unsigned long long)s.cached_stitch_hits, (unsigned long long)nulls.load());
  gmlake_test::check_released(a);
}

gmlake::options opts() {
  gmlake::options o;
  o.small_max = 16 * kib;
  o.on_misuse = &on_misuse;
  return o;
}

} // namespace

TEST_CASE("stress: threads on one gmlake_allocator<host_memfd>") {
  misuses = 0;
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts());
  run_stress(a, true);
  CHECK(misuses == 0);
}

TEST_CASE("stress: threads on one gmlake_allocator<simulated>") {
  misuses = 0;
  gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts());
  run_stress(a, false);
  CHECK(misuses == 0);
}

TEST_CASE("stress: threads on one bfc_allocator<host_memfd>") {
  misuses = 0;
  gmlake::bfc_allocator<host_memfd> a(host_memfd(cap, C), opts());
  run_stress(a, true);
  CHECK(misuses == 0);
}
