// tests/test_faults.cpp - every backend call of a fixed scenario fails in turn.
//
// The scenario (small pool, splitting, stitching, the stitched-block cache, LRU
// eviction, growth by the shortfall, two streams, release_cached) is run once clean
// to count its backend calls per kind, then once per call with that call failing
// (fault_injecting), once as a one-off failure, once "sticky" (that call and
// every later one of its kind fail, until the scenario's end), and once followed by
// a failure of the next unmap, release or address_free (two failures in one
// operation: a step and its undo). Every kind of call fails, release and
// address_free included. Each run checks:
//  - an operation fails only if a fault was injected during it, and then as
//    documented: try_allocate gives nullptr, allocate throws out_of_memory, the
//    constructor throws out_of_memory, release_cached releases less;
//  - check_invariants() after every operation (and GMLAKE_DEBUG=2 inside);
//  - the pattern written into each live block is intact when it is freed;
//  - with the faults disarmed, later allocations work and hold data;
//  - after release_cached() and the destructor, the real backend holds nothing:
//    no chunk, no mapping, no reservation; and, counted below the fault injector,
//    every chunk created was released and every reservation freed.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>
#include <doctest/doctest.h>

#include "support.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using gmlake::call;
using gmlake::errc;
using gmlake::backend::counting;
using gmlake::backend::fault;
using gmlake::backend::fault_injecting;
using gmlake::backend::host_memfd;
using gmlake::backend::simulated;
namespace policy = gmlake::policy;

static_assert(gmlake::PhysicalBackend<fault_injecting<simulated>>);
static_assert(gmlake::PhysicalBackend<fault_injecting<host_memfd>>);
static_assert(gmlake::PhysicalBackend<fault_injecting<counting<host_memfd>>>);
static_assert(gmlake::PhysicalBackend<gmlake_test::borrowed<counting<host_memfd>>>);

constexpr std::size_t kib = 1024;
constexpr std::size_t C = 64 * kib;
constexpr std::size_t cap = 64 * C;

/// The real backend, counted; the allocator reaches it through the fault injector.
using real = counting<host_memfd>;
using faulty = fault_injecting<gmlake_test::borrowed<real>>;
/// Stitching, LRU keeping at most one cached stitched block (so eviction happens).
using alloc_t = gmlake::basic_allocator<faulty, policy::best_fit_pieces, policy::lru>;

int misuses = 0;
void on_misuse(const char*, void*) { ++misuses; }

unsigned char pat(std::uint32_t seed, std::size_t k) {
  return static_cast<unsigned char>(((seed * 1000003u + k) * 2654435761u) >> 24);
}

/// What one run saw.
struct outcome {
  std::uint64_t injected = 0;       ///< faults injected
  std::uint64_t reported = 0;       ///< operations that failed (nullptr, throw, less released)
  std::uint64_t spurious = 0;       ///< operations that failed with no fault injected: a bug
  std::uint64_t bad_data = 0;       ///< blocks whose pattern changed
  std::uint64_t broken = 0;         ///< check_invariants() false
  std::size_t small_chunk = 0;      ///< the largest small-arena chunk seen
  bool constructed = true;
};

/// The default stitch policy, its small arena grown by at least what it holds
/// (1, 1, 2, 4 ... slots), so the scenario's small requests make chunks of several slots.
policy::best_fit_pieces scenario_policy() {
  policy::best_fit_pieces p;
  p.grow.small_divisor = 1;
  return p;
}

/// Runs the scenario on `a`, checking as it goes.
class driver {
 public:
  driver(alloc_t& a, outcome& o) : a_(a), o_(o) {}

  /// Allocates into slot `name` (nothing if the request fails).
  void alloc(int name, std::size_t n, std::uintptr_t stream = 0, bool throwing = false) {
    const std::uint64_t before = a_.backend().injected();
    void* p = nullptr;
    if (throwing) {
      try {
        p = a_.allocate(n, gmlake::host_stream{stream});
      } catch (const gmlake::out_of_memory& e) {
        if (e.bytes() != n) ++o_.spurious;
      }
    } else {
      p = a_.try_allocate(n, gmlake::host_stream{stream});
    }
    if (p == nullptr) {
      ++o_.reported;
      if (a_.backend().injected() == before) ++o_.spurious;
    } else {
      if (reinterpret_cast<std::uintptr_t>(p) % 512 != 0) ++o_.spurious;
      slot(name) = block{p, n, stream, static_cast<std::uint32_t>(name * 7919 + n)};
      fill(*slot(name));
    }
    check();
  }

  /// Frees slot `name` on `stream` (its own stream if none), checking its data first.
  void free(int name, std::optional<std::uintptr_t> stream = std::nullopt) {
    auto& b = slot(name);
    if (!b) return;
    if (!intact(*b)) ++o_.bad_data;
    a_.deallocate(b->p, b->n, gmlake::host_stream{stream.value_or(b->stream)});
    b.reset();
    check();
  }

  void release() {
    const std::uint64_t before = a_.backend().injected();
    const auto s0 = a_.stats();
    (void)a_.release_cached();
    const auto s1 = a_.stats();
    // Documented: it releases what it can; a failed backend call leaves the rest cached.
    if (a_.backend().injected() != before && (s1.stitched_blocks.current > 0 || s1.reserved_bytes.current > 0) &&
        s1.reserved_bytes.current >= s0.reserved_bytes.current)
      ++o_.reported;
    check();
  }

  /// Notes the largest chunk of the small arena now.
  void note_small_chunks() {
    a_.visit_layout(
        [&](const gmlake::layout_segment& g) {
          if (g.kind == gmlake::layout_segment::small_chunk) o_.small_chunk = std::max(o_.small_chunk, g.bytes);
        },
        [](const gmlake::layout_piece&) {});
  }

  void check_all() {
    for (auto& b : live_)
      if (b && !intact(*b)) ++o_.bad_data;
  }
  void free_all() {
    for (int i = 0; i < static_cast<int>(live_.size()); ++i) free(i);
  }

 private:
  struct block {
    void* p;
    std::size_t n;
    std::uintptr_t stream;
    std::uint32_t seed;
  };
  std::optional<block>& slot(int name) {
    if (live_.size() <= static_cast<std::size_t>(name)) live_.resize(static_cast<std::size_t>(name) + 1);
    return live_[static_cast<std::size_t>(name)];
  }
  static void fill(const block& b) {
    auto* c = static_cast<unsigned char*>(b.p);
    for (std::size_t i = 0; i < b.n; i += 128) c[i] = pat(b.seed, i);
    c[b.n - 1] = pat(b.seed, b.n - 1);
  }
  static bool intact(const block& b) {
    const auto* c = static_cast<const unsigned char*>(b.p);
    for (std::size_t i = 0; i < b.n; i += 128)
      if (c[i] != pat(b.seed, i)) return false;
    return c[b.n - 1] == pat(b.seed, b.n - 1);
  }
  void check() {
    if (!a_.check_invariants()) ++o_.broken;
  }

  alloc_t& a_;
  outcome& o_;
  std::vector<std::optional<block>> live_;
};

void scenario(driver& d) {
  // Small pool: three requests packed into one chunk, on two streams.
  d.alloc(0, 1 * kib);
  d.alloc(1, 3 * kib);
  d.alloc(2, 10 * kib, 1);
  // Small growth in chunks of several slots: 12 x 16 KiB more need a third growth,
  // of two slots in one chunk; half of them freed at once, the rest at the end.
  for (int i = 50; i < 62; ++i) d.alloc(i, 16 * kib, static_cast<std::uintptr_t>(i % 2));
  d.note_small_chunks();
  for (int i = 50; i < 62; i += 2) d.free(i);
  // A B C D of two chunks each; A and C freed: 4 chunks free, none adjacent.
  for (int i = 10; i < 14; ++i) d.alloc(i, 2 * C);
  d.alloc(19, 2 * C);  // X, after D
  d.free(10);
  d.free(12);
  d.alloc(20, 4 * C);  // S3: A and C stitched
  d.free(20);          // cached
  d.alloc(21, 4 * C);  // S1 on the cache
  d.free(21);
  d.alloc(24, C);      // takes part of A or C: the cached block cannot be claimed whole
  d.free(19);          // X: free chunks of the same bytes elsewhere
  d.alloc(25, 4 * C);  // S1 on the cache, repaired: X's chunk in place of the taken one
  d.free(25);
  d.free(24);
  d.alloc(26, 6 * C);  // S3 on the cache, appended: the cached block and 2C of free chunks after it
  d.free(26);
  // E F G H; E and G freed; a second stitch pushes the first out of the cache (LRU).
  for (int i = 14; i < 18; ++i) d.alloc(i, 2 * C);
  d.free(14);
  d.free(16);
  d.alloc(22, 4 * C, 0, true);  // through allocate(): throws out_of_memory on failure
  d.alloc(23, 4 * C);
  d.free(22);
  d.free(23);  // over the cache's one block: eviction
  // Splitting, a request on another stream (events), growth by the shortfall.
  d.alloc(30, C + 512);
  d.free(2, 2);        // freed on stream 2
  d.alloc(31, 2 * kib, 3);  // stream 3 asks about stream 2's free: record + query
  d.alloc(32, 5 * C, 2);
  d.free(11, 1);
  d.alloc(33, 7 * C, 3);
  d.release();  // waits for streams, unmaps the cache, releases free chunks
  d.alloc(34, 3 * C);
  d.alloc(35, 4 * kib);
  d.free(13);
  d.free(15);
  d.alloc(36, 6 * C, 1);
  d.check_all();
  d.free_all();
  d.release();
}

/// Totals over the runs of one kind.
struct tally {
  std::uint64_t runs = 0, injected = 0, reported = 0, absorbed = 0, failures = 0;
};

/// One run: fault `k` at call `nth` (0: none). Returns what it saw; CHECKs the end state.
outcome run(fault k, std::uint64_t nth, bool sticky, std::array<std::uint64_t, gmlake::backend::fault_count>* totals,
            std::optional<fault> then = std::nullopt) {
  outcome o;
  real backend(cap, C);
  misuses = 0;
  {
    std::optional<alloc_t> a;
    gmlake::options opt;
    opt.small_max = 16 * kib;
    opt.on_misuse = &on_misuse;
    // Construction itself reserves: arm the fault before it by building the injector first.
    faulty probe(&backend);
    probe.fail_at(k, nth, gmlake::backend::default_error(k), sticky);
    if (then) probe.then_fail(*then);
    try {
      a.emplace(std::move(probe), opt, scenario_policy(), policy::lru{std::size_t{1} << 40, 1});
    } catch (const gmlake::out_of_memory&) {
      o.constructed = false;
      o.injected = 1;
      o.reported = 1;
    }
    if (a) {
      driver d(*a, o);
      scenario(d);
      o.injected = a->backend().injected();
      if (totals != nullptr)
        for (std::size_t i = 0; i < totals->size(); ++i) (*totals)[i] = a->backend().calls(static_cast<fault>(i));
      // Faults off: later allocations work and hold data.
      a->backend().disarm();
      outcome after;
      driver later(*a, after);
      later.alloc(0, 2 * kib);
      later.alloc(1, 3 * C);
      later.alloc(2, 9 * C, 1);
      later.check_all();
      CHECK(after.reported == 0);
      CHECK(after.bad_data == 0);
      CHECK(after.broken == 0);
      later.free_all();
      // What a failed call left cached goes now.
      (void)a->release_cached();
      CHECK(a->check_invariants());
      const auto s = a->stats();
      CHECK(s.allocations.current == 0);
      CHECK(s.reserved_bytes.current == 0);
      CHECK(s.mapped_bytes.current == 0);
      CHECK(s.chunks.current == 0);
      CHECK(s.stitched_blocks.current == 0);
      CHECK(s.quarantined_bytes.current == 0);     // every failed undo was retried
      CHECK(s.quarantined_stitches.current == 0);
      CHECK(s.invalid_frees == 0);
      CHECK(backend.parent().mapping_count() == 0);
      CHECK(backend.parent().chunk_count() == 0);
      CHECK(backend.parent().reservation_count() == 2);  // the two arenas
    }
  }
  // The allocator is gone: the real backend holds nothing, and every chunk created
  // and every reservation made through it was given back.
  const auto& c = backend.counts();
  CHECK(backend.parent().reservation_count() == 0);
  CHECK(backend.parent().mapping_count() == 0);
  CHECK(backend.parent().chunk_count() == 0);
  CHECK(backend.parent().created_bytes() == 0);
  CHECK(c.calls_of(call::create) - c.failures_of(call::create) == c.calls_of(call::release));
  CHECK(c.calls_of(call::reserve) - c.failures_of(call::reserve) == c.calls_of(call::address_free));
  CHECK(c.failures_of(call::release) == 0);
  CHECK(c.failures_of(call::address_free) == 0);
  CHECK(c.failures_of(call::unmap) == 0);
  CHECK(misuses == 0);
  CHECK(o.spurious == 0);
  CHECK(o.bad_data == 0);
  CHECK(o.broken == 0);
  return o;
}

/// Every call of every kind fails once, and then the next call of kind `then`
/// (the undo of the failed step, or of the rollback) fails too.
void sweep_twice(fault then) {
  std::array<std::uint64_t, gmlake::backend::fault_count> totals{};
  (void)run(fault::create, 0, false, &totals);
  std::uint64_t runs = 0, injected = 0, reported = 0;
  for (std::size_t k = 0; k < gmlake::backend::fault_count; ++k) {
    const auto kind = static_cast<fault>(k);
    CAPTURE(gmlake::backend::fault_names[k]);
    for (std::uint64_t n = 1; n <= totals[k]; ++n) {
      CAPTURE(n);
      const outcome o = run(kind, n, false, nullptr, then);
      ++runs;
      injected += o.injected;
      reported += o.reported;
    }
  }
  std::printf("[faults] twice, then %-12s: %llu runs, %llu faults injected, %llu operations failed as "
              "documented, all survived\n",
              gmlake::backend::fault_names[static_cast<std::size_t>(then)], (unsigned long long)runs,
              (unsigned long long)injected, (unsigned long long)reported);
}

void sweep(bool sticky) {
  std::array<std::uint64_t, gmlake::backend::fault_count> totals{};
  const outcome clean = run(fault::create, 0, false, &totals);
  REQUIRE(clean.constructed);
  CHECK(clean.injected == 0);
  CHECK(clean.reported == 0);
  std::uint64_t all_runs = 0, all_injected = 0, all_reported = 0;
  for (std::size_t k = 0; k < gmlake::backend::fault_count; ++k) {
    const auto kind = static_cast<fault>(k);
    CAPTURE(gmlake::backend::fault_names[k]);
    CHECK(totals[k] > 0);  // the scenario makes calls of every kind
    tally t;
    for (std::uint64_t n = 1; n <= totals[k]; ++n) {
      CAPTURE(n);
      const outcome o = run(kind, n, sticky, nullptr);
      ++t.runs;
      t.injected += o.injected;
      t.reported += o.reported;
      if (o.injected > 0 && o.reported == 0) ++t.absorbed;
      CHECK(o.injected >= 1);
    }
    std::printf("[faults] %-6s %-10s calls %3llu | runs %3llu | injected %4llu | ops failed %3llu | "
                "runs where every fault was absorbed %3llu\n",
                sticky ? "sticky" : "once", gmlake::backend::fault_names[k], (unsigned long long)totals[k],
                (unsigned long long)t.runs, (unsigned long long)t.injected, (unsigned long long)t.reported,
                (unsigned long long)t.absorbed);
    all_runs += t.runs;
    all_injected += t.injected;
    all_reported += t.reported;
  }
  std::printf("[faults] %-6s total: %llu runs, %llu faults injected, %llu operations failed as documented, "
              "all survived (checks above)\n",
              sticky ? "sticky" : "once", (unsigned long long)all_runs, (unsigned long long)all_injected,
              (unsigned long long)all_reported);
}

} // namespace

TEST_CASE("faults: the scenario covers every path it claims to") {
  real backend(cap, C);
  gmlake::options opt;
  opt.small_max = 16 * kib;
  alloc_t a(faulty(&backend), opt, scenario_policy(), policy::lru{std::size_t{1} << 40, 1});
  outcome o;
  driver d(a, o);
  scenario(d);
  const auto s = a.stats();
  auto fit = [&](gmlake::fit_state f) { return s.fit[static_cast<std::size_t>(f)]; };
  CHECK(fit(gmlake::fit_state::s1_exact) > 0);
  CHECK(fit(gmlake::fit_state::s2_split) > 0);
  CHECK(fit(gmlake::fit_state::s3_stitch) > 0);
  CHECK(fit(gmlake::fit_state::s4_shortfall) > 0);
  CHECK(s.cached_stitch_hits > 0);
  CHECK(s.cached_stitch_repairs > 0);
  CHECK(s.cached_stitch_appends > 0);
  CHECK(s.evictions > 0);
  CHECK(s.calls[static_cast<std::size_t>(call::record)] > 0);
  CHECK(o.small_chunk >= 2 * C);  // a small growth of several slots in one chunk
  CHECK(o.reported == 0);
  CHECK(o.bad_data == 0);
  CHECK(o.broken == 0);
  gmlake_test::check_released(a);
}

TEST_CASE("faults: every backend call of the scenario fails once, in turn") { sweep(false); }

TEST_CASE("faults: from every call on, every call of its kind fails (sticky)") { sweep(true); }

TEST_CASE("faults: every call fails and then the undo after it fails too (two failures in one operation)") {
  for (fault then : {fault::unmap, fault::release, fault::address_free, fault::map}) sweep_twice(then);
}

TEST_CASE("faults: the fault injector counts, fails the n-th call, forwards the rest") {
  fault_injecting<simulated> b(cap, C);
  auto c0 = b.create(C);
  CHECK(c0);
  b.fail_at(fault::create, 3);
  CHECK(b.create(C));
  CHECK(b.create(C).error == errc::out_of_memory);
  CHECK(b.parent().chunk_count() == 2);  // the failed call never reached the parent
  CHECK(b.create(C));
  CHECK(b.calls(fault::create) == 4);
  CHECK(b.injected() == 1);
  b.fail_at(fault::event, 1, errc::driver, true);
  b.reset_counts();
  CHECK(b.record(gmlake::host_stream{0}).error == errc::driver);
  CHECK(b.synchronize({}) == errc::driver);
  CHECK(b.query({}).error == errc::driver);
  CHECK(b.injected() == 3);
  b.disarm();
  CHECK(b.record(gmlake::host_stream{0}));
  CHECK(b.total_calls() == 4);
}

// Regression: with a cached stitched block whose stream work is pending, a
// destructor whose event calls all fail must still end (the pool's forced unmap
// does not give up when it cannot wait).
TEST_CASE("faults: the destructor ends even when no event call succeeds") {
  real backend(cap, C);
  {
    gmlake::options opt;
    opt.small_max = 16 * kib;
    alloc_t a(faulty(&backend), opt, policy::best_fit_pieces{}, policy::lru{});
    a.backend().parent().target().parent().set_auto_complete(false);
    std::vector<void*> four;
    for (int i = 0; i < 4; ++i) four.push_back(a.allocate(2 * C, gmlake::host_stream{1}));
    a.deallocate(four[0], 0, gmlake::host_stream{1});
    a.deallocate(four[2], 0, gmlake::host_stream{1});
    void* x = a.allocate(4 * C, gmlake::host_stream{1});
    a.deallocate(x, 0, gmlake::host_stream{1});  // cached, its stream work pending
    a.deallocate(four[1], 0, gmlake::host_stream{1});
    a.deallocate(four[3], 0, gmlake::host_stream{1});
    REQUIRE(a.stats().stitched_blocks.current == 1);
    a.backend().fail_at(fault::event, 1, gmlake::errc::driver, true);
    CHECK(a.release_cached() == 0);  // cannot wait: releases nothing, breaks nothing
    CHECK(a.check_invariants());
    CHECK(a.stats().stitched_blocks.current == 1);
  }
  CHECK(backend.parent().reservation_count() == 0);
  CHECK(backend.parent().mapping_count() == 0);
  CHECK(backend.parent().chunk_count() == 0);
}

// Regression (found by tests/fuzz): growing a free range into the hole before it,
// when the new chunks fill the hole, merged them first with the free range on the
// hole's other side (pending on another stream) and then not with the neighbour,
// and the request was carved from that merge: too small (carve outside a free
// range) or, when large enough, bytes another stream's work still used.
TEST_CASE("faults (fuzz regression): extension into a hole between two pending free ranges") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), [] {
    gmlake::options o;
    o.small_max = 16 * kib;
    return o;
  }());
  a.backend().set_auto_complete(false);
  void* x = a.allocate(C, gmlake::host_stream{1});      // [0, C)
  void* y = a.allocate(C, gmlake::host_stream{1});      // [C, 2C): becomes the hole
  void* z = a.allocate(2 * C, gmlake::host_stream{1});  // [2C, 4C)
  void* w = a.allocate(C, gmlake::host_stream{1});      // fence
  REQUIRE(static_cast<char*>(y) == static_cast<char*>(x) + C);
  REQUIRE(static_cast<char*>(z) == static_cast<char*>(y) + C);
  a.deallocate(y, C, gmlake::host_stream{1});
  CHECK(a.release_cached() == C);
  a.deallocate(x, C, gmlake::host_stream{2});      // pending on stream 2
  a.deallocate(z, 2 * C, gmlake::host_stream{1});  // pending on stream 1
  void* p = a.allocate(3 * C, gmlake::host_stream{1});
  CHECK(p != x);  // never bytes stream 2 may still use
  std::memset(p, 1, 3 * C);
  CHECK(a.check_invariants());
  a.deallocate(p, 3 * C, gmlake::host_stream{1});
  a.deallocate(w, C, gmlake::host_stream{1});
  gmlake_test::check_released(a);
}

TEST_CASE("faults: stats count each kind of backend call and the ones that failed") {
  real backend(cap, C);
  gmlake::options opt;
  opt.small_max = 16 * kib;
  alloc_t a(faulty(&backend), opt, policy::best_fit_pieces{}, policy::lru{});
  void* p = a.allocate(2 * C);
  const auto s0 = a.stats();
  CHECK(s0.calls[static_cast<std::size_t>(gmlake::call::create)] >= 1);
  for (auto f : s0.call_failures) CHECK(f == 0);
  a.backend().fail_at(fault::map, a.backend().calls(fault::map) + 1);  // the next map fails
  void* q = a.try_allocate(4 * C);  // its growth's map fails: it fails, or is served another way
  if (q != nullptr) a.deallocate(q);
  const auto s1 = a.stats();
  CHECK(s1.call_failures[static_cast<std::size_t>(gmlake::call::map)] == 1);
  CHECK(s1.call_failures[static_cast<std::size_t>(gmlake::call::create)] == 0);
  CHECK(s1.calls[static_cast<std::size_t>(gmlake::call::map)] > s0.calls[static_cast<std::size_t>(gmlake::call::map)]);
  a.backend().disarm();
  CHECK(a.check_invariants());
  a.deallocate(p);
}

namespace {

/// host_memfd with one-shot failures of set_access and unmap, events failing while
/// `fail_events` is set, and a watch on unmaps over one address.
struct flaky_memfd : gmlake::backend::forwarding<host_memfd*> {
  using gmlake::backend::forwarding<host_memfd*>::forwarding;
  bool fail_access = false, fail_unmap = false, fail_events = false;
  std::uintptr_t watch = 0;
  bool unmapped_while_pending = false, watch_unmapped = false;
  errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    if (fail_access) {
      fail_access = false;
      return errc::driver;
    }
    return parent().set_access(va, n);
  }
  errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    if (fail_unmap) {
      fail_unmap = false;
      return errc::driver;
    }
    if (va <= watch && watch < va + n) {
      watch_unmapped = true;
      if (parent().pending(gmlake::host_stream{1})) unmapped_while_pending = true;
    }
    return parent().unmap(va, n);
  }
  gmlake::result<event_type> record(stream_type s) noexcept {
    if (fail_events) return errc::driver;
    return parent().record(s);
  }
  gmlake::result<bool> query(event_type e) noexcept {
    if (fail_events) return errc::driver;
    return parent().query(e);
  }
  errc synchronize(event_type e) noexcept {
    if (fail_events) return errc::driver;
    return parent().synchronize(e);
  }
};

}  // namespace

TEST_CASE("faults: a cached block given up on after a failed append is unmapped only once its work is done") {
  host_memfd hm(64 * C, C);
  hm.set_auto_complete(false);
  gmlake::options o;
  o.small_max = 16 * 1024;
  policy::best_fit_pieces one_slot;
  one_slot.grow.max_chunk = 0;
  one_slot.grow.small_divisor = 0;
  gmlake::gmlake_allocator<flaky_memfd> a(flaky_memfd(&hm), o, one_slot);
  const gmlake::host_stream s1{1};
  void* x1 = a.allocate(C, s1);
  void* y1 = a.allocate(C, s1);
  void* x2 = a.allocate(C, s1);
  void* y2 = a.allocate(C, s1);
  void* z = a.allocate(C, s1);
  a.deallocate(x1, C, s1);
  a.deallocate(x2, C, s1);
  void* s = a.allocate(2 * C, s1);  // a stitched block over x1 and x2
  (void)hm.record(s1);              // work using it queued on stream 1
  a.deallocate(s, 2 * C, s1);       // cached, its work pending
  a.deallocate(z, C, s1);
  a.backend().watch = reinterpret_cast<std::uintptr_t>(s);
  // z appended to the cached block: the access call fails, its undo fails, and no
  // event call succeeds, so the block is given up on without a wait.
  a.backend().fail_access = a.backend().fail_unmap = a.backend().fail_events = true;
  void* t = a.allocate(3 * C, s1);
  a.backend().fail_events = false;
  REQUIRE(t != nullptr);
  CHECK(a.stats().quarantined_stitches.current == 1);
  void* u = a.allocate(8 * C, s1);  // the next growth retries the quarantine
  REQUIRE(u != nullptr);
  CHECK(a.backend().watch_unmapped);
  CHECK_FALSE(a.backend().unmapped_while_pending);  // it waited for stream 1 first
  CHECK(a.stats().quarantined_stitches.current == 0);
  REQUIRE(a.check_invariants());
  for (void* p : {u, t, y1, y2}) a.deallocate(p, 0, s1);
  gmlake_test::check_released(a);
}

// reset_peaks() resets every gauge's peak, the quarantine's too.
TEST_CASE("faults: reset_peaks() resets the peaks of the quarantine gauges") {
  gmlake::allocator<fault_injecting<simulated>> a(fault_injecting<simulated>(cap, C));
  void* p = a.allocate(4 * C);
  a.deallocate(p, 4 * C);
  a.backend().fail_at(fault::release, 1);  // the release after the unmap fails: quarantined
  (void)a.release_cached();
  a.backend().disarm();
  REQUIRE(a.stats().quarantined_bytes.current > 0);
  (void)a.release_cached();  // the retry succeeds
  a.reset_peaks();
  const auto s = a.stats();
  CHECK(s.quarantined_bytes.current == 0);
  CHECK(s.quarantined_bytes.peak == 0);
  CHECK(s.quarantined_stitches.peak == s.quarantined_stitches.current);
  CHECK(s.reserved_bytes.peak == s.reserved_bytes.current);
}
