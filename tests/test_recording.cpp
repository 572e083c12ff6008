// tests/test_recording.cpp - recording_allocator: the trace it writes reads back
// through gmlake-replay's loader (bench/trace.hpp) and replays through a fresh
// allocator to the same peak live bytes; streams, frees and failures are as made;
// memory_summary() shows live and reserved memory.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory_resource>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../bench/trace.hpp"
#include "support.hpp"

namespace {

using gmlake::backend::host_memfd;
using gmlake::backend::simulated;
using sim_alloc = gmlake::allocator<simulated>;
using rec_alloc = gmlake::recording_allocator<sim_alloc>;

static_assert(gmlake::StreamAllocator<sim_alloc>);
static_assert(gmlake::StreamAllocator<rec_alloc>);
// The std::pmr view sits on a recorder as on an allocator (where memory can be touched).
static_assert(requires(gmlake::recording_allocator<gmlake::allocator<host_memfd>>& r) { gmlake::memory_resource(r); });

constexpr std::size_t C = std::size_t{2} << 20;

std::string temp_trace(const char* name) {
  return std::string(P_tmpdir) + "/gmlake-test-" + name + "-" + std::to_string(::getpid()) + ".trace.gz";
}

/// Replays `t` through a fresh allocator as gmlake-replay does; returns its peak
/// live bytes (each request rounded up to 512) and leaves nothing allocated.
std::uint64_t replay_peak_live(const gmlake_bench::trace& t, gmlake::statistics* stats = nullptr) {
  sim_alloc a(simulated(std::size_t{1} << 34, C));
  std::vector<void*> ptrs(t.ids, nullptr);
  std::vector<std::uintptr_t> streams(t.ids, 0);
  std::uint64_t live = 0, peak = 0;
  std::vector<std::uint64_t> sizes(t.ids, 0);
  for (const auto& e : t.events) {
    if (e.kind == gmlake_bench::event::alloc) {
      ptrs[e.id] = a.allocate(e.bytes, gmlake::host_stream{e.stream});
      streams[e.id] = e.stream;
      sizes[e.id] = gmlake::round_up(e.bytes == 0 ? 1 : e.bytes, 512);
      live += sizes[e.id];
      if (live > peak) peak = live;
    } else if (e.kind == gmlake_bench::event::free && ptrs[e.id] != nullptr) {
      a.deallocate(ptrs[e.id], 0, gmlake::host_stream{streams[e.id]});
      ptrs[e.id] = nullptr;
      live -= sizes[e.id];
    }
  }
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    if (ptrs[i]) a.deallocate(ptrs[i], 0, gmlake::host_stream{streams[i]});
  if (stats) *stats = a.stats();
  gmlake_test::check_released(a);
  return peak;
}

} // namespace

TEST_CASE("recording: a recorded workload replays to the same peak live bytes") {
  const std::string path = temp_trace("workload");
  sim_alloc a(simulated(std::size_t{1} << 34, C));
  std::uint64_t peak = 0;
  {
    rec_alloc rec(a, path, "unit-test");
    std::mt19937 rng(3);
    std::vector<std::pair<void*, gmlake::host_stream>> live;
    for (unsigned step = 0; step < 6; ++step) {
      rec.mark_iteration(step);
      for (int i = 0; i < 200; ++i) {
        const std::size_t n = (rng() % 4 == 0) ? (rng() % (8 * C)) : (rng() % 65536);
        const gmlake::host_stream s{rng() % 3};
        live.emplace_back(rec.allocate(n, s), s);
        if (rng() % 3 == 0 && !live.empty()) {
          const std::size_t k = rng() % live.size();
          rec.deallocate(live[k].first, 0, live[k].second);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
    }
    for (auto& [p, s] : live) rec.deallocate(p, 0, s);
    peak = rec.peak_live_bytes();
    CHECK(rec.live_bytes() == 0);
    CHECK(rec.events() == 1200);
    // Requests at the default alignment are placed at 512-byte granularity: the
    // allocator's own peak of active bytes is the recorder's peak live.
    CHECK(static_cast<std::uint64_t>(a.stats().active_bytes.peak) == peak);
    const std::string summary = rec.summary();
    CHECK(summary.find("Reserved memory") != std::string::npos);
    CHECK(summary.find("Recorded: 1200 allocations") != std::string::npos);
    CHECK(rec.close());
  }
  gmlake_bench::trace t;
  REQUIRE(gmlake_bench::load(path, t));
  CHECK(t.allocs == 1200);
  std::size_t iters = 0, on_other_streams = 0;
  for (const auto& e : t.events) {
    iters += e.kind == gmlake_bench::event::iter;
    on_other_streams += e.kind == gmlake_bench::event::alloc && e.stream != 0;
  }
  CHECK(iters == 6);
  CHECK(on_other_streams > 0);
  gmlake::statistics replayed;
  CHECK(replay_peak_live(t, &replayed) == peak);
  CHECK(static_cast<std::uint64_t>(replayed.active_bytes.peak) == peak);
  std::remove(path.c_str());
  gmlake_test::check_released(a);
}

TEST_CASE("recording: a failed request is no event, and the recorder forwards the failure") {
  const std::string path = temp_trace("oom");
  sim_alloc a(simulated(8 * C, C));
  {
    rec_alloc rec(a, path);
    void* p = rec.allocate(3 * C);
    CHECK(rec.try_allocate(64 * C) == nullptr);
    CHECK_THROWS_AS((void)rec.allocate(64 * C), gmlake::out_of_memory);
    rec.deallocate(p, 3 * C);
    CHECK(rec.events() == 1);
    CHECK(rec.good());
  }
  gmlake_bench::trace t;
  REQUIRE(gmlake_bench::load(path, t));
  CHECK(t.allocs == 1);
  CHECK(t.events.size() == 2);
  std::remove(path.c_str());
  gmlake_test::check_released(a);
}

TEST_CASE("recording: std::pmr containers over a recorder over real memory") {
  const std::string path = temp_trace("pmr");
  gmlake::allocator<host_memfd> a(host_memfd(std::size_t{64} << 20, std::size_t{64} << 10));
  {
    gmlake::recording_allocator rec(a, path, "pmr");
    gmlake::memory_resource mr(rec);
    {
      std::pmr::vector<int> v(&mr);
      for (int i = 0; i < 100000; ++i) v.push_back(i);
      CHECK(v[99999] == 99999);
    }
    CHECK(rec.events() > 10);  // the vector's growth
    CHECK(rec.live_bytes() == 0);
    const std::string s = gmlake::memory_summary(a.stats());
    CHECK(s.find("Peak Usage") != std::string::npos);
  }
  gmlake_bench::trace t;
  REQUIRE(gmlake_bench::load(path, t));
  CHECK(t.allocs > 10);
  std::remove(path.c_str());
  gmlake_test::check_released(a);
}

TEST_CASE("recording: a .gz trace that cannot be created throws, as a plain one does") {
  sim_alloc a(simulated(8 * C, C));
  CHECK_THROWS_AS(rec_alloc(a, "/nonexistent-gmlake-dir/job.trace.gz"), std::runtime_error);
  CHECK_THROWS_AS(rec_alloc(a, "/nonexistent-gmlake-dir/job.trace"), std::runtime_error);
  gmlake_test::check_released(a);
}

TEST_CASE("recording: gzip that cannot write ends no process: allocation goes on and good() turns false") {
  // A .gz name for /dev/full: gzip fails on its first write and exits, and the
  // recorder's writes then meet a pipe with no reader (SIGPIPE unless held off).
  const std::string path = temp_trace("full");
  std::remove(path.c_str());
  if (::symlink("/dev/full", path.c_str()) != 0) return;  // no /dev/full here: nothing to test
  sim_alloc a(simulated(8 * C, C));
  {
    rec_alloc rec(a, path);
    // Sizes that compress poorly, for more than gzip's output buffer (256 KiB).
    std::mt19937 rng(7);
    int served = 0;
    for (int i = 0; i < 200000; ++i) {
      const std::size_t n = 1 + rng() % 1000000;
      void* p = rec.allocate(n);
      served += p != nullptr;
      rec.deallocate(p, n);
    }
    CHECK(served == 200000);
    CHECK_FALSE(rec.good());  // the writes failed before the end
    CHECK_FALSE(rec.close());
    CHECK_FALSE(rec.good());
  }
  std::remove(path.c_str());
  gmlake_test::check_released(a);
}
