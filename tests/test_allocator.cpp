// tests/test_allocator.cpp - targeted tests of basic_allocator: BestFit states, the
// stitched-block cache, eviction, stream order, statistics, misuse, std::pmr.
#include <gmlake/backend/forwarding.hpp>
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>
#include <doctest/doctest.h>

#include "support.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <memory_resource>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using gmlake::call;
using gmlake::backend::host_memfd;

using counted_memfd = gmlake::backend::counting<host_memfd>;
using gmlake::fit_state;
using gmlake::backend::counting;
using gmlake::backend::simulated;
namespace policy = gmlake::policy;

constexpr std::size_t kib = 1024;
constexpr std::size_t mib = kib * kib;
constexpr std::size_t C = 64 * kib;
constexpr std::size_t cap = 32 * mib;

int misuses = 0;
const char* last_misuse = nullptr;
void on_misuse(const char* what, void*) {
  ++misuses;
  last_misuse = what;
}

gmlake::options opts() {
  gmlake::options o;
  o.small_max = 16 * kib;
  o.on_misuse = &on_misuse;
  return o;
}

/// opts() with every request in the large arena.
gmlake::options large_only() {
  gmlake::options o = opts();
  o.small_max = 0;
  return o;
}

/// The stream-order tests' backend, over the simulated one with its work held
/// pending until completed by hand.
template <class Backend>
Backend& held(gmlake::allocator<Backend>& a) {
  a.backend().parent().set_auto_complete(false);
  return a.backend();
}

/// Stitch policy P, its growth creating one slot per chunk (in both arenas), no
/// borrowing: these tests count calls per chunk.
template <class P = policy::best_fit_pieces>
P one_slot() {
  P p;
  p.grow.max_chunk = 0;
  p.grow.settled_max_chunk = 0;
  p.grow.small_divisor = 0;
  p.grow.lends.borrow_max = 0;
  return p;
}

/// The default stitch policy growing in chunks of up to `most` bytes, `settled` once
/// the job has settled, with no floor: these tests count the chunks of each growth.
policy::best_fit_pieces sized(std::size_t most, std::size_t settled) {
  policy::best_fit_pieces p;
  p.grow.max_chunk = most;
  p.grow.settled_max_chunk = settled;
  p.grow.floor = 0;
  p.grow.floor_divisor = 0;
  return p;
}

std::uint64_t fit(const gmlake::statistics& s, fit_state f) { return s.fit[static_cast<std::size_t>(f)]; }
std::int64_t reserved(const auto& a) { return a.stats().reserved_bytes.current; }

// One byte every 64, a hash of (seed, its index from `start`).
unsigned char pat(unsigned seed, std::size_t k) {
  return static_cast<unsigned char>(((seed * 1000003u + k) * 2654435761u) >> 24);
}
void fill(void* p, std::size_t n, unsigned seed, std::size_t start = 0) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 64) b[i] = pat(seed, start + i / 64);
}
bool holds(const void* p, std::size_t n, unsigned seed, std::size_t start = 0) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 64)
    if (b[i] != pat(seed, start + i / 64)) return false;
  return true;
}


/// Four blocks A B C D of 2 chunks each, side by side; A and C freed.
template <class A>
struct four {
  A& a;
  void* p[4];
  explicit four(A& al) : a(al) {
    for (auto& x : p) {
      x = a.allocate(2 * C);
    }
    a.deallocate(p[0]);
    a.deallocate(p[2]);
  }
};

/// four's A and C stitched into `x` and cached (`before_free(a)` runs just before
/// x is freed), then one chunk of A or C `taken` and a `spare` of two chunks, after
/// D, freed: x cannot be claimed whole, and free chunks of the same bytes lie elsewhere.
/// `settled`: the job settles first (x asked for again and again, at 8 chunks
/// reserved) and there is no spare: no free chunk outside x can replace the taken one.
template <class A>
struct taken_stitch {
  A& a;
  four<A> f;
  void* spare = nullptr;
  void* x = nullptr;
  void* taken = nullptr;
  template <class BeforeFree>
  taken_stitch(A& al, BeforeFree before_free, bool settled = false) : a(al), f(al) {
    if (settled) {
      for (int i = 0; i < 8; ++i) a.deallocate(a.allocate(4 * C));
    } else {
      spare = a.allocate(2 * C);
    }
    x = a.allocate(4 * C);
    before_free(a);
    a.deallocate(x);
    taken = a.allocate(C);
    if (spare != nullptr) a.deallocate(spare);
  }
  explicit taken_stitch(A& al) : taken_stitch(al, [](A&) {}) {}
  /// Frees what is left of it.
  void free_rest() {
    a.deallocate(taken);
    a.deallocate(f.p[1]);
    a.deallocate(f.p[3]);
  }
};

} // namespace

TEST_CASE("S1: a freed block of the same size is reused") {
  misuses = 0;
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  void* p = a.allocate(2 * C);
  void* keep = a.allocate(C);
  a.deallocate(p, 2 * C);
  const auto s0 = a.stats();
  void* q = a.allocate(2 * C);
  const auto s1 = a.stats();
  CHECK(q == p);
  CHECK(fit(s1, fit_state::s1_exact) == fit(s0, fit_state::s1_exact) + 1);
  CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
  a.deallocate(q);
  a.deallocate(keep);
  gmlake_test::check_released(a);
  CHECK(misuses == 0);
}

TEST_CASE("S2: a smaller request splits a free range") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  void* p = a.allocate(3 * C);
  a.deallocate(p);
  const auto s0 = a.stats();
  void* q = a.allocate(C);
  void* r = a.allocate(C + 512);
  const auto s1 = a.stats();
  CHECK(fit(s1, fit_state::s2_split) == fit(s0, fit_state::s2_split) + 2);
  CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
  CHECK(q == p);
  CHECK(static_cast<char*>(r) == static_cast<char*>(p) + C);
  a.deallocate(q);
  a.deallocate(r);
  gmlake_test::check_released(a);
}

using largest_first_memfd = gmlake::basic_allocator<host_memfd, policy::largest_first>;

// The paper's configuration stitches only requests of 512 MiB or more: here it
// grows a new segment, as bfc does.
TEST_CASE_TEMPLATE("S3: non-adjacent free pieces", A, gmlake::gmlake_allocator<host_memfd>, largest_first_memfd,
                   gmlake::gmlake_paper_allocator<host_memfd>, gmlake::bfc_allocator<host_memfd>,
                   gmlake::expandable_allocator<host_memfd>) {
  A a(host_memfd(cap, C), opts(), one_slot<typename A::stitch_type>());
  four<A> f(a);
  const auto s0 = a.stats();
  CHECK(s0.reserved_bytes.current == static_cast<std::int64_t>(8 * C));
  void* x = a.allocate(4 * C);
  const auto s1 = a.stats();
  constexpr bool stitches = std::is_same_v<A, gmlake::gmlake_allocator<host_memfd>> ||
                            std::is_same_v<A, largest_first_memfd>;
  if (stitches) {
    CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
    CHECK(fit(s1, fit_state::s3_stitch) == fit(s0, fit_state::s3_stitch) + 1);
    CHECK(s1.stitched_blocks.current == 1);
    CHECK(s1.mapped_bytes.current == s0.mapped_bytes.current + static_cast<std::int64_t>(4 * C));
    // The stitched block aliases A and C: what is written through it is in them.
    fill(x, 4 * C, 11);
    CHECK(holds(x, 4 * C, 11));
    const bool a_first = holds(f.p[0], 2 * C, 11);
    const bool c_first = holds(f.p[2], 2 * C, 11);
    CHECK(a_first != c_first);
    if (a_first) CHECK(holds(f.p[2], 2 * C, 11, 2 * C / 64));
    if (c_first) CHECK(holds(f.p[0], 2 * C, 11, 2 * C / 64));
    a.deallocate(x);
    // A' and C' land on A and C, with the stitched bytes in them.
    void* a2 = a.allocate(2 * C);
    void* c2 = a.allocate(2 * C);
    CHECK(((a2 == f.p[0] && c2 == f.p[2]) || (a2 == f.p[2] && c2 == f.p[0])));
    CHECK(reserved(a) == s0.reserved_bytes.current);
    CHECK((holds(a2, 2 * C, 11) || holds(c2, 2 * C, 11)));
    CHECK((holds(a2, 2 * C, 11, 2 * C / 64) || holds(c2, 2 * C, 11, 2 * C / 64)));
    a.deallocate(a2);
    a.deallocate(c2);
  } else {
    CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current + static_cast<std::int64_t>(4 * C));
    CHECK(fit(s1, fit_state::s3_stitch) == 0);
    CHECK(s1.stitched_blocks.current == 0);
    fill(x, 4 * C, 3);
    CHECK(holds(x, 4 * C, 3));
    a.deallocate(x);
  }
  a.deallocate(f.p[1]);
  a.deallocate(f.p[3]);
  gmlake_test::check_released(a);
}

TEST_CASE("S4: only the shortfall is created") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  SUBCASE("stitched with new chunks") {
    void* l1 = a.allocate(2 * C);
    void* x = a.allocate(2 * C);
    void* l2 = a.allocate(2 * C);
    a.deallocate(x);
    const auto s0 = a.stats();
    void* y = a.allocate(3 * C);
    const auto s1 = a.stats();
    CHECK(fit(s1, fit_state::s4_shortfall) == fit(s0, fit_state::s4_shortfall) + 1);
    CHECK(s1.reserved_bytes.current - s0.reserved_bytes.current == static_cast<std::int64_t>(C));
    fill(y, 3 * C, 5);
    CHECK(holds(y, 3 * C, 5));
    fill(l1, 2 * C, 1);
    fill(l2, 2 * C, 2);
    CHECK(holds(y, 3 * C, 5));
    a.deallocate(y);
    a.deallocate(l1);
    a.deallocate(l2);
  }
  SUBCASE("extension of the top free range") {
    void* l1 = a.allocate(2 * C);
    void* x = a.allocate(2 * C);
    a.deallocate(x);
    const auto s0 = a.stats();
    void* y = a.allocate(3 * C);
    const auto s1 = a.stats();
    CHECK(y == x);
    CHECK(fit(s1, fit_state::s4_shortfall) == fit(s0, fit_state::s4_shortfall) + 1);
    CHECK(s1.reserved_bytes.current - s0.reserved_bytes.current == static_cast<std::int64_t>(C));
    CHECK(s1.stitched_blocks.current == 0);
    fill(y, 3 * C, 9);
    CHECK(holds(y, 3 * C, 9));
    a.deallocate(y);
    a.deallocate(l1);
  }
  gmlake_test::check_released(a);
}

TEST_CASE("S4: expandable grows by the shortfall, bfc by the whole request") {
  gmlake::expandable_allocator<simulated> e(simulated(cap, C), opts(), one_slot<policy::expand_only>());
  gmlake::bfc_allocator<simulated> b(simulated(cap, C), opts(), one_slot<policy::no_stitch>());
  void* e1 = e.allocate(2 * C);
  void* b1 = b.allocate(2 * C);
  e.deallocate(e1);
  b.deallocate(b1);
  const auto er = reserved(e), br = reserved(b);
  void* e2 = e.allocate(3 * C);
  void* b2 = b.allocate(3 * C);
  CHECK(reserved(e) - er == static_cast<std::int64_t>(C));
  CHECK(reserved(b) - br == static_cast<std::int64_t>(3 * C));
  CHECK(e2 == e1);
  e.deallocate(e2);
  b.deallocate(b2);
  gmlake_test::check_released(e);
  gmlake_test::check_released(b);
}

TEST_CASE("S5: out of memory") {
  gmlake::gmlake_allocator<simulated> a(simulated(16 * C, C), opts(), one_slot());
  const auto s0 = a.stats();
  CHECK(a.try_allocate(16 * C + 1) == nullptr);
  auto s1 = a.stats();
  CHECK(fit(s1, fit_state::s5_oom) == fit(s0, fit_state::s5_oom) + 1);
  CHECK(s1.num_ooms == s0.num_ooms + 1);
  void* p = a.allocate(10 * C);
  void* q = a.try_allocate(10 * C);  // fits the capacity, not what is left
  CHECK(q == nullptr);
  s1 = a.stats();
  CHECK(s1.num_alloc_retries >= 1);
  CHECK(s1.num_ooms == s0.num_ooms + 2);
  CHECK(a.check_invariants());
  void* r = a.allocate(6 * C);  // exactly the rest
  CHECK(r != nullptr);
  CHECK_THROWS_AS((void)a.allocate(1), gmlake::out_of_memory);
  a.deallocate(p);
  a.deallocate(r);
  gmlake_test::check_released(a);
}

TEST_CASE("cached stitched block reuse: no new mappings") {
  gmlake::gmlake_allocator<counted_memfd> a(counted_memfd(cap, C), opts(), one_slot());
  using A = decltype(a);
  four<A> f(a);
  void* x = a.allocate(4 * C);
  CHECK(a.stats().stitched_blocks.current == 1);
  fill(x, 4 * C, 21);
  a.deallocate(x);
  CHECK(a.check_invariants());
  const auto maps = a.backend().counts().calls_of(call::map);
  const auto s0 = a.stats();
  void* y = a.allocate(4 * C);
  const auto s1 = a.stats();
  CHECK(y == x);
  CHECK(s1.cached_stitch_hits == s0.cached_stitch_hits + 1);
  CHECK(fit(s1, fit_state::s1_exact) == fit(s0, fit_state::s1_exact) + 1);
  CHECK(a.backend().counts().calls_of(call::map) == maps);
  CHECK(s1.calls[static_cast<std::size_t>(call::map)] == s0.calls[static_cast<std::size_t>(call::map)]);
  CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
  CHECK(holds(y, 4 * C, 21));
  CHECK(a.check_invariants());
  a.deallocate(y);
  a.deallocate(f.p[1]);
  a.deallocate(f.p[3]);
  gmlake_test::check_released(a);
}

TEST_CASE("a cached stitched block whose chunk was taken is repaired: only that chunk is mapped anew") {
  gmlake::gmlake_allocator<counted_memfd> a(counted_memfd(cap, C), opts(), one_slot());
  taken_stitch t(a);
  CHECK((t.taken == t.f.p[0] || t.taken == t.f.p[2]));
  fill(t.taken, C, 40);
  const auto& n = a.backend().counts();
  const auto maps = n.calls_of(call::map), unmaps = n.calls_of(call::unmap), reserves = n.calls_of(call::reserve);
  const auto s0 = a.stats();
  void* y = a.allocate(4 * C);
  const auto s1 = a.stats();
  CHECK(y == t.x);  // the same block, its reservation kept
  CHECK(s1.cached_stitch_hits == s0.cached_stitch_hits + 1);
  CHECK(s1.cached_stitch_repairs == s0.cached_stitch_repairs + 1);
  CHECK(fit(s1, fit_state::s1_exact) == fit(s0, fit_state::s1_exact) + 1);
  CHECK(n.calls_of(call::unmap) == unmaps + 1);    // the taken chunk out
  CHECK(n.calls_of(call::map) == maps + 1);        // one chunk of the spare in
  CHECK(n.calls_of(call::reserve) == reserves);    // no new reservation
  CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
  CHECK(a.check_invariants());
  // The block's bytes are its own: writing them leaves the taken chunk's data alone,
  // and they land in the spare's chunk.
  fill(y, 4 * C, 41);
  CHECK(holds(y, 4 * C, 41));
  CHECK(holds(t.taken, C, 40));
  const auto* sp = static_cast<const unsigned char*>(t.spare);
  const auto* yb = static_cast<const unsigned char*>(y);
  bool in_spare = false;
  for (std::size_t at = 0; at < 4 * C && !in_spare; at += C)
    in_spare = std::memcmp(yb + at, sp, C) == 0 || std::memcmp(yb + at, sp + C, C) == 0;
  CHECK(in_spare);
  a.deallocate(y);
  CHECK(a.check_invariants());
  t.free_rest();
  gmlake_test::check_released(a);
}

TEST_CASE("repair never waits: a cached block whose free's work is pending is stitched anew instead") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  using A = decltype(a);
  // Its kernels may still run when x is freed: the free's work stays pending.
  taken_stitch t(a, [](A& al) { al.backend().set_auto_complete(false); });
  void* y = a.allocate(4 * C);
  CHECK(y != nullptr);
  CHECK(y != t.x);  // not repaired: that would remap under pending work
  CHECK(a.stats().cached_stitch_repairs == 0);
  CHECK(a.backend().pending(gmlake::host_stream{0}));  // and nothing waited for it
  a.backend().complete(gmlake::host_stream{0});
  a.deallocate(y);
  t.free_rest();
  gmlake_test::check_released(a);
}

namespace {
template <class A>
struct taken_settled : taken_stitch<A> {
  explicit taken_settled(A& al) : taken_stitch<A>(al, [](A&) {}, true) {}
};
} // namespace

TEST_CASE("settled: a cached block with no free chunk to replace its taken one is repaired with a new chunk") {
  gmlake::gmlake_allocator<counted_memfd> a(counted_memfd(cap, C), opts(), one_slot());
  taken_settled t(a);
  fill(t.taken, C, 50);
  const auto& n = a.backend().counts();
  const auto creates = n.calls_of(call::create), unmaps = n.calls_of(call::unmap);
  const auto access = n.calls_of(call::set_access);
  const auto s0 = a.stats();
  void* y = a.allocate(4 * C);
  const auto s1 = a.stats();
  CHECK(y == t.x);  // the same block: one new chunk mapped in place of the taken one
  CHECK(s1.cached_stitch_repairs == s0.cached_stitch_repairs + 1);
  CHECK(fit(s1, fit_state::s4_shortfall) == fit(s0, fit_state::s4_shortfall) + 1);
  CHECK(n.calls_of(call::create) == creates + 1);
  CHECK(n.calls_of(call::unmap) == unmaps + 1);         // the taken chunk out of the block
  CHECK(n.calls_of(call::set_access) == access + 2);    // the new chunk in its arena, then in the block
  CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current + static_cast<std::int64_t>(C));
  CHECK(a.check_invariants());
  fill(y, 4 * C, 51);
  CHECK(holds(y, 4 * C, 51));
  CHECK(holds(t.taken, C, 50));
  a.deallocate(y);
  void* z = a.allocate(4 * C);  // and cached whole again
  CHECK(z == t.x);
  CHECK(a.stats().cached_stitch_hits == s1.cached_stitch_hits + 1);
  a.deallocate(z);
  CHECK(a.check_invariants());
  t.free_rest();
  gmlake_test::check_released(a);
}

TEST_CASE("settled: a repair with new chunks may create up to twice the bytes of the stitch it saves") {
  // Chunks of 2 slots, no floor. The cached block x maps four free 2-slot chunks;
  // then one of them is taken and a 1-slot chunk e elsewhere is freed. A stitch anew
  // would map x's three chunks and e and create 1 slot; the repair creates the taken
  // chunk's 2 slots (twice that) and maps only them, and e stays free.
  gmlake::gmlake_allocator<counted_memfd> a(counted_memfd(cap, C), opts(), sized(2 * C, 2 * C));
  void* piece[4];
  void* guard[4];
  for (int i = 0; i < 4; ++i) {
    piece[i] = a.allocate(2 * C);
    guard[i] = a.allocate(2 * C);
  }
  void* e = a.allocate(C);
  void* g = a.allocate(C);
  for (void* p : piece) a.deallocate(p);
  for (int i = 0; i < 8; ++i) a.deallocate(a.allocate(8 * C));  // the job settles
  void* x = a.allocate(8 * C);
  a.deallocate(x);
  void* taken = a.allocate(2 * C);
  fill(taken, 2 * C, 60);
  a.deallocate(e);
  const auto& n = a.backend().counts();
  const auto creates = n.calls_of(call::create), maps = n.calls_of(call::map);
  const auto s0 = a.stats();
  void* y = a.allocate(8 * C);
  const auto s1 = a.stats();
  CHECK(y == x);  // repaired in place
  CHECK(s1.cached_stitch_repairs == s0.cached_stitch_repairs + 1);
  CHECK(n.calls_of(call::create) == creates + 1);  // one chunk of the taken one's 2 slots
  CHECK(n.calls_of(call::map) == maps + 2);        // in its arena, then in the block
  CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current + static_cast<std::int64_t>(2 * C));
  CHECK(a.check_invariants());
  fill(y, 8 * C, 61);
  CHECK(holds(y, 8 * C, 61));
  CHECK(holds(taken, 2 * C, 60));
  void* e2 = a.allocate(C);  // e was left free: reused, nothing created
  CHECK(e2 == e);
  CHECK(n.calls_of(call::create) == creates + 1);
  a.deallocate(e2);
  a.deallocate(y);
  a.deallocate(taken);
  a.deallocate(g);
  for (void* p : guard) a.deallocate(p);
  CHECK(a.check_invariants());
  gmlake_test::check_released(a);
}

namespace {
/// With options `o`, the cached block of Fixture (taken_stitch, taken_settled) is not
/// repaired: the request is stitched anew.
template <template <class> class Fixture>
void stitched_anew(gmlake::options o) {
  gmlake::gmlake_allocator<counted_memfd> a(counted_memfd(cap, C), o, one_slot());
  Fixture<decltype(a)> t(a);
  const auto repairs = a.stats().cached_stitch_repairs;
  void* y = a.allocate(4 * C);
  CHECK(y != t.x);
  CHECK(a.stats().cached_stitch_repairs == repairs);
  CHECK(a.check_invariants());
  a.deallocate(y);
  t.free_rest();
  gmlake_test::check_released(a);
}
} // namespace

TEST_CASE("not settled or repair off: that block is stitched anew instead") {
  gmlake::options not_settled = opts(), repair_off = opts();
  not_settled.settle_window = 0;
  repair_off.repair_chunks = 0;
  stitched_anew<taken_settled>(not_settled);
  stitched_anew<taken_settled>(repair_off);
}

TEST_CASE("repair off: a cached stitched block with a taken chunk is not used") {
  gmlake::options o = opts();
  o.repair_chunks = 0;
  stitched_anew<taken_stitch>(o);
}

TEST_CASE("a cached stitched block costs no new reservation until released") {
  gmlake::gmlake_allocator<counted_memfd> a(counted_memfd(cap, C), opts(), one_slot());
  using A = decltype(a);
  four<A> f(a);
  const auto reserves = a.backend().counts().calls_of(call::reserve);
  void* x = a.allocate(4 * C);
  CHECK(a.backend().counts().calls_of(call::reserve) == reserves + 1);
  CHECK(a.backend().counts().calls_of(call::map) >= 4 + 8);
  a.deallocate(x);
  auto s = a.stats();
  CHECK(s.stitched_blocks.current == 1);  // cached
  CHECK(s.mapped_bytes.current == static_cast<std::int64_t>(8 * C + 4 * C));
  const auto unmaps = a.backend().counts().calls_of(call::unmap);
  (void)a.release_cached();
  s = a.stats();
  CHECK(s.stitched_blocks.current == 0);
  CHECK(a.backend().counts().calls_of(call::unmap) > unmaps);
  CHECK(s.reserved_bytes.current == static_cast<std::int64_t>(4 * C));  // B and D
  a.deallocate(f.p[1]);
  a.deallocate(f.p[3]);
  gmlake_test::check_released(a);
  CHECK(a.backend().parent().created_bytes() == 0);
}

TEST_CASE("small pool packs small requests into one chunk") {
  SUBCASE("100 x 1 KiB in a 2 MiB chunk") {
    gmlake::gmlake_allocator<host_memfd> a(host_memfd(16 * mib, 2 * mib));
    std::vector<void*> v;
    for (int i = 0; i < 100; ++i) {
      v.push_back(a.allocate(kib));
      std::memset(v.back(), i, kib);
    }
    CHECK(reserved(a) == static_cast<std::int64_t>(2 * mib));
    CHECK(a.stats().chunks.current == 1);
    for (int i = 0; i < 100; ++i) CHECK(static_cast<unsigned char*>(v[i])[kib - 1] == i);
    for (void* p : v) a.deallocate(p, kib);
    gmlake_test::check_released(a);
  }
  SUBCASE("64 x 1 KiB fill a 64 KiB chunk, the 65th takes another") {
    gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts(), one_slot());
    std::vector<void*> v;
    for (int i = 0; i < 64; ++i) v.push_back(a.allocate(kib));
    CHECK(reserved(a) == static_cast<std::int64_t>(C));
    v.push_back(a.allocate(kib));
    CHECK(reserved(a) == static_cast<std::int64_t>(2 * C));
    for (void* p : v) a.deallocate(p);
    gmlake_test::check_released(a);
  }
}

namespace {
/// Two stitched blocks, X from A+C and Y from E+G, both freed (X first).
template <class A>
void two_stitches(A& a, std::vector<void*>& keep) {
  void* p[8];
  for (auto& x : p) x = a.allocate(2 * C);
  a.deallocate(p[0]);
  a.deallocate(p[2]);
  void* x = a.allocate(4 * C);
  a.deallocate(p[4]);
  a.deallocate(p[6]);
  void* y = a.allocate(4 * C);
  CHECK(x != y);
  CHECK(a.stats().stitched_blocks.current == 2);
  a.deallocate(x);
  a.deallocate(y);
  keep = {p[1], p[3], p[5], p[7]};
}
} // namespace

namespace {
/// A fit strategy written against the type-erased free_view only (not generic over
/// the view, as the library's are): best fit, counting the ranges it is shown.
struct view_only_fit {
  std::size_t* shown;
  gmlake::free_range pick(gmlake::free_view& ranges) const noexcept {
    gmlake::free_range r;
    while (ranges.next(r)) {
      ++*shown;
      if (r.usable) return r;
    }
    return {};
  }
};
static_assert(gmlake::FitStrategy<view_only_fit>);
} // namespace

TEST_CASE("a fit strategy that takes only a free_view is shown the ranges through it and places as best_fit does") {
  std::size_t shown = 0;
  gmlake::basic_allocator<simulated, policy::best_fit_pieces, policy::lru, view_only_fit> v(
      simulated(cap, C), opts(), one_slot(), policy::lru{}, view_only_fit{&shown});
  gmlake::gmlake_allocator<simulated> b(simulated(cap, C), opts(), one_slot());
  // Free ranges of several sizes, then requests that fit some of them exactly or split others.
  std::vector<void*> pv, pb;
  for (std::size_t n : {C / 2, C, C / 4, 2 * C, C / 2, C}) {
    pv.push_back(v.allocate(n));
    pb.push_back(b.allocate(n));
  }
  for (std::size_t i : {0u, 2u, 4u}) {
    v.deallocate(pv[i]);
    b.deallocate(pb[i]);
  }
  for (std::size_t n : {C / 4, C / 2, C / 8}) {
    void* x = v.allocate(n);
    void* y = b.allocate(n);
    CHECK(static_cast<char*>(x) - static_cast<char*>(pv[1]) == static_cast<char*>(y) - static_cast<char*>(pb[1]));
    pv.push_back(x);
    pb.push_back(y);
  }
  CHECK(shown > 0);
  CHECK(v.stats().fit == b.stats().fit);
  for (std::size_t i : {1u, 3u, 5u, 6u, 7u, 8u}) {
    v.deallocate(pv[i]);
    b.deallocate(pb[i]);
  }
  gmlake_test::check_released(v);
  gmlake_test::check_released(b);
}

TEST_CASE("LRU eviction bounds the cached stitched blocks") {
  gmlake::basic_allocator<host_memfd, policy::best_fit_pieces, policy::lru> a(
      host_memfd(cap, C), opts(), one_slot(), policy::lru{std::size_t{1} << 40, 1});
  std::vector<void*> keep;
  two_stitches(a, keep);
  const auto s = a.stats();
  CHECK(s.evictions >= 1);
  CHECK(s.stitched_blocks.current == 1);
  CHECK(a.check_invariants());
  for (void* p : keep) a.deallocate(p);
  gmlake_test::check_released(a);
}

TEST_CASE("LRU eviction by bytes") {
  gmlake::basic_allocator<simulated, policy::best_fit_pieces, policy::lru> a(
      simulated(cap, C), opts(), one_slot(), policy::lru{4 * C, 4096});
  std::vector<void*> keep;
  two_stitches(a, keep);
  const auto s = a.stats();
  CHECK(s.evictions >= 1);
  CHECK(s.stitched_blocks.current == 1);
  for (void* p : keep) a.deallocate(p);
  gmlake_test::check_released(a);
}

TEST_CASE("no_cache unmaps a stitched block as soon as it is freed") {
  gmlake::basic_allocator<counted_memfd, policy::best_fit_pieces, policy::no_cache> a(
      counted_memfd(cap, C), opts(), one_slot());
  using A = decltype(a);
  four<A> f(a);
  void* x = a.allocate(4 * C);
  CHECK(a.stats().stitched_blocks.current == 1);
  const auto frees = a.backend().counts().calls_of(call::address_free);
  a.deallocate(x);
  const auto s = a.stats();
  CHECK(s.evictions == 1);
  CHECK(s.stitched_blocks.current == 0);
  CHECK(s.mapped_bytes.current == static_cast<std::int64_t>(8 * C));
  CHECK(a.backend().counts().calls_of(call::address_free) == frees + 1);
  // The same request stitches anew.
  void* y = a.allocate(4 * C);
  CHECK(a.stats().cached_stitch_hits == 0);
  CHECK(fit(a.stats(), fit_state::s3_stitch) == 2);
  a.deallocate(y);
  a.deallocate(f.p[1]);
  a.deallocate(f.p[3]);
  gmlake_test::check_released(a);
}

TEST_CASE("release_cached returns the bytes it releases") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  void* p = a.allocate(3 * C);
  void* q = a.allocate(kib);
  void* r = a.allocate(5 * C);
  CHECK(reserved(a) == static_cast<std::int64_t>(9 * C));
  a.deallocate(r);
  CHECK(a.release_cached() == 5 * C);
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  CHECK(a.release_cached() == 0);
  a.deallocate(p);
  a.deallocate(q);
  CHECK(a.release_cached() == 4 * C);
  CHECK(reserved(a) == 0);
  CHECK(a.stats().chunks.current == 0);
  gmlake_test::check_released(a);
}

TEST_CASE("stream-ordered reuse") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  a.backend().set_auto_complete(false);
  void* p = a.allocate(C, gmlake::host_stream{1});
  void* fence = a.allocate(C, gmlake::host_stream{1});  // keeps p's range apart from growth
  a.deallocate(p, C, gmlake::host_stream{1});
  void* p2 = a.allocate(C, gmlake::host_stream{1});
  CHECK(p2 == p);  // same stream: at once
  a.deallocate(p2, C, gmlake::host_stream{1});
  void* q = a.allocate(C, gmlake::host_stream{2});
  CHECK(q != nullptr);
  CHECK(q != p);  // stream 1's work is pending
  CHECK(a.backend().pending(gmlake::host_stream{1}));
  a.backend().complete(gmlake::host_stream{1});
  void* r = a.allocate(C, gmlake::host_stream{2});
  CHECK(r == p);  // done: usable on stream 2
  a.deallocate(q, C, gmlake::host_stream{2});
  a.deallocate(r, C, gmlake::host_stream{2});
  a.deallocate(fence, C, gmlake::host_stream{1});
  CHECK(a.check_invariants());
  gmlake_test::check_released(a);  // release_cached waits for pending work
  CHECK(!a.backend().pending(gmlake::host_stream{1}));
  CHECK(!a.backend().pending(gmlake::host_stream{2}));
}

// Regression: growth merges the new chunks with an adjacent free range that may still
// be pending on another stream; the request must then be placed in the new bytes
// only (basic_allocator::place takes them at `fresh`), never at the start of the
// merged range, which here would be p, freed on stream 1 whose work is pending.
namespace {
/// The simulated backend with one handle that names another stream on each thread,
/// as CUDA's per-thread default stream (cudaStreamPerThread) does: `thread` is the
/// calling thread; an event recorded on the handle goes to that thread's stream. It
/// says so as cuda_vmm does (stream_key).
struct per_thread_streams : gmlake::backend::forwarding<simulated> {
  using forwarding::forwarding;
  static constexpr auto handle = gmlake::host_stream{2};
  int thread = 1;
  int records_elsewhere = 0;  ///< events recorded on the handle from another thread than the free's
  int freeing_thread = 0;
  gmlake::host_stream real(gmlake::host_stream s) const {
    return s == handle ? gmlake::host_stream{100 + static_cast<std::uintptr_t>(thread)} : s;
  }
  gmlake::result<event_type> record(stream_type s) noexcept {
    if (s == handle && thread != freeing_thread) ++records_elsewhere;
    return parent().record(real(s));
  }
  std::uint64_t stream_key(stream_type s) const noexcept { return s == handle ? static_cast<std::uint64_t>(thread) : 0; }
};
} // namespace

TEST_CASE("stream order: the per-thread default stream is one stream per thread") {
  gmlake::allocator<per_thread_streams> a(per_thread_streams(cap, C), large_only());
  auto& b = held(a);
  const auto h = per_thread_streams::handle;
  void* p = a.allocate(4 * C, h);  // on thread 1's stream
  auto kernel = b.parent().record(b.real(h));  // thread 1's work on p, still queued
  REQUIRE(kernel);
  b.freeing_thread = 1;
  a.deallocate(p, 4 * C, h);
  b.thread = 2;  // the same handle on another thread: another stream
  void* q = a.allocate(4 * C, h);
  CHECK(q != p);  // not before thread 1's work is done
  CHECK(b.records_elsewhere == 0);  // nothing of thread 1's recorded on thread 2's stream
  b.thread = 1;
  b.parent().complete(b.real(h));  // thread 1's work done, and the event of its free
  b.thread = 2;
  void* r = a.allocate(4 * C, h);
  CHECK(r == p);  // p's bytes go to thread 2 now, by the event recorded at the free
  CHECK(b.records_elsewhere == 0);
  CHECK(a.check_invariants());
  b.parent().set_auto_complete(true);
  b.parent().complete(b.real(h));
  b.freeing_thread = 2;
  a.deallocate(q, 4 * C, h);
  a.deallocate(r, 4 * C, h);
  gmlake_test::check_released(a);
}

namespace {
/// The simulated backend that knows a stream handle destroyed: an event recorded
/// on it counts as a use of a dead handle (on CUDA: undefined behaviour).
struct destroyable_streams : gmlake::backend::forwarding<simulated> {
  using forwarding::forwarding;
  std::optional<gmlake::host_stream> dead;
  int dead_records = 0;
  gmlake::result<event_type> record(stream_type s) noexcept {
    if (dead == s) ++dead_records;
    return parent().record(s);
  }
};
} // namespace

TEST_CASE("stream order: a forgotten stream's frees are usable at once, and its handle is never used again") {
  gmlake::allocator<destroyable_streams> a(destroyable_streams(cap, C), large_only());
  auto& b = held(a);
  const gmlake::host_stream s0{}, s1{1}, s2{2};
  void* p = a.allocate(4 * C, s1);
  a.deallocate(p, 4 * C, s1);
  b.parent().complete(s1);  // the job synchronizes s1 ...
  bool forget = false;
  SUBCASE("forgotten") { forget = true; }
  SUBCASE("not forgotten") {}
  if (forget) a.forget_stream(s1);
  b.dead = s1;  // ... and destroys it
  void* q = a.allocate(4 * C, s2);
  if (forget) {
    CHECK(q == p);  // done, as the caller promised: no event needed
    CHECK(b.dead_records == 0);
  } else {
    CHECK(b.dead_records >= 1);  // why forget_stream exists: the lazy event goes to the dead handle
  }
  a.deallocate(q, 4 * C, s2);
  // A stream made later with the same handle is a new stream: its frees are pending.
  b.dead.reset();
  void* r = a.allocate(4 * C, s1);
  void* fence = a.allocate(4 * C, s1);
  a.deallocate(r, 4 * C, s1);
  void* t = a.allocate(4 * C, s2);
  CHECK(t != r);  // s1's new work is pending
  // The default stream is never forgotten: its pending free stays pending.
  void* d = a.allocate(4 * C, s0);
  a.deallocate(d, 4 * C, s0);
  a.forget_stream(s0);
  a.forget_stream(gmlake::host_stream{7});  // a stream never seen: nothing
  void* u = a.allocate(4 * C, s2);
  CHECK(u != d);
  CHECK(u != r);
  CHECK(a.check_invariants());
  b.parent().set_auto_complete(true);
  for (auto s : {s0, s1, s2}) b.parent().complete(s);
  a.deallocate(t, 4 * C, s2);
  a.deallocate(u, 4 * C, s2);
  a.deallocate(fence, 4 * C, s1);
  gmlake_test::check_released(a);
}

TEST_CASE("stream order: growth next to a range pending on another stream") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  a.backend().set_auto_complete(false);
  void* p = a.allocate(C, gmlake::host_stream{1});
  a.deallocate(p, C, gmlake::host_stream{1});
  void* q = a.allocate(C, gmlake::host_stream{2});
  CHECK(q != p);
  CHECK(a.check_invariants());
  a.deallocate(q, C, gmlake::host_stream{2});
  gmlake_test::check_released(a);
}

// Regression: releasing the free chunks of a range whose stream work is done went
// on into the free range after it when the released chunks reached its end (two
// segments side by side: bfc makes each growth a new segment), and released that
// range's chunks too, though the stream it was freed on still had work pending.
TEST_CASE("stream order: releasing free chunks stops at the end of the range it was given") {
  gmlake::options o;
  o.small_max = C;  // requests of one chunk go to the small arena
  gmlake::bfc_allocator<host_memfd> a(host_memfd(64 * C, C), o);
  host_memfd& m = a.backend();
  const gmlake::host_stream s0{0}, s1{1}, s2{2};
  m.set_auto_complete(false);
  void* p1 = a.allocate(C, s0);  // the small arena: a chunk of one segment
  void* p2 = a.allocate(C, s0);  // the chunk after it, of another segment
  REQUIRE(static_cast<char*>(p2) == static_cast<char*>(p1) + C);
  const std::size_t p2_at = m.offset_of(reinterpret_cast<std::uintptr_t>(p2)).value;
  a.deallocate(p1, C, s0);
  a.deallocate(p2, C, s2);  // stream 2's work may still use p2's bytes
  void* big1 = a.allocate(2 * C, s1);  // the large arena grows past the peak
  m.complete(s0);                      // stream 0's work is done, stream 2's is not
  void* big2 = a.allocate(2 * C, s1);  // past the peak again: the small arena gives back free chunks
  REQUIRE(m.pending(s2));
  CHECK(m.offset_of(reinterpret_cast<std::uintptr_t>(p2)));  // p2's chunk still mapped
  for (std::size_t i = 0; i < 2 * C; i += 4 * kib) {      // and its bytes in no new block
    const auto at = m.offset_of(reinterpret_cast<std::uintptr_t>(big2) + i);
    CHECK_FALSE((at && at.value >= p2_at && at.value < p2_at + C));
  }
  CHECK(a.check_invariants());
  a.deallocate(big1, 2 * C, s1);
  a.deallocate(big2, 2 * C, s1);
  m.complete_all();
  gmlake_test::check_released(a);
}

TEST_CASE("stream-ordered reuse in the small arena") {
  gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts(), one_slot());
  a.backend().set_auto_complete(false);
  std::vector<void*> v;
  for (int i = 0; i < 16; ++i) v.push_back(a.allocate(4 * kib, gmlake::host_stream{7}));  // one whole chunk
  CHECK(reserved(a) == static_cast<std::int64_t>(C));
  void* p = v[0];
  a.deallocate(p, 0, gmlake::host_stream{7});
  void* q = a.allocate(4 * kib, gmlake::host_stream{8});
  CHECK(q != p);
  void* p2 = a.allocate(4 * kib, gmlake::host_stream{7});
  CHECK(p2 == p);
  a.deallocate(p2, 0, gmlake::host_stream{7});
  void* r = a.allocate(4 * kib, gmlake::host_stream{8});
  CHECK(r != p);
  a.backend().complete(gmlake::host_stream{7});
  void* s = a.allocate(4 * kib, gmlake::host_stream{8});
  CHECK(s == p);
  for (void* x : {q, r, s}) a.deallocate(x, 0, gmlake::host_stream{8});
  for (int i = 1; i < 16; ++i) a.deallocate(v[i], 0, gmlake::host_stream{7});
  gmlake_test::check_released(a);
}

TEST_CASE("statistics") {
  gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts(), one_slot());
  void* p = a.allocate(1000);
  void* q = a.allocate(C + 1);
  auto s = a.stats();
  CHECK(s.requested_bytes.current == 1000 + static_cast<std::int64_t>(C) + 1);
  CHECK(s.active_bytes.current == 1024 + static_cast<std::int64_t>(C) + 512);
  CHECK(s.allocations.current == 2);
  CHECK(s.allocations.peak == 2);
  CHECK(s.reserved_bytes.current == static_cast<std::int64_t>(3 * C));
  a.deallocate(q);
  s = a.stats();
  CHECK(s.allocations.current == 1);
  CHECK(s.allocations.peak == 2);
  CHECK(s.allocations.allocated == 2);
  CHECK(s.allocations.freed == 1);
  CHECK(s.active_bytes.peak == 1024 + static_cast<std::int64_t>(C) + 512);
  CHECK(s.requested_bytes.current == 1000);
  a.reset_peaks();
  s = a.stats();
  CHECK(s.allocations.peak == 1);
  CHECK(s.active_bytes.peak == 1024);
  CHECK(s.reserved_bytes.peak == s.reserved_bytes.current);
  std::uint64_t total = 0;
  for (auto f : s.fit) total += f;
  CHECK(total == 2);
  CHECK(s.calls[static_cast<std::size_t>(call::create)] >= 3);
  CHECK(s.calls[static_cast<std::size_t>(call::reserve)] >= 2);  // the two arenas
  a.deallocate(p);
  gmlake_test::check_released(a);
  CHECK(a.stats().reserved_bytes.peak == static_cast<std::int64_t>(3 * C));
}

TEST_CASE("misuse: double and foreign free are counted and ignored") {
  misuses = 0;
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  void* p = a.allocate(2 * kib);
  void* big = a.allocate(2 * C);
  void* keep = a.allocate(kib);
  a.deallocate(p);
  const auto s0 = a.stats();
  a.deallocate(p);  // double free
  CHECK(misuses == 1);
  int local = 0;
  a.deallocate(&local);  // foreign
  CHECK(misuses == 2);
  a.deallocate(static_cast<char*>(keep) + 512);  // inside a live block
  CHECK(misuses == 3);
  a.deallocate(big);
  a.deallocate(big);
  CHECK(misuses == 4);
  a.deallocate(nullptr);  // not misuse
  CHECK(misuses == 4);
  const auto s1 = a.stats();
  CHECK(s1.invalid_frees == s0.invalid_frees + 4);
  CHECK(s1.allocations.current == s0.allocations.current - 1);
  CHECK(a.check_invariants());
  std::memset(keep, 1, kib);
  a.deallocate(keep, 999);  // wrong size: reported, freed anyway
  CHECK(misuses == 5);
  CHECK(a.stats().allocations.current == 0);
  gmlake_test::check_released(a, 4);  // the four misuses above
}

TEST_CASE("misuse: a stitched block freed twice") {
  misuses = 0;
  gmlake::basic_allocator<simulated, policy::best_fit_pieces, policy::lru> a(simulated(cap, C), opts(), one_slot());
  using A = decltype(a);
  four<A> f(a);
  void* x = a.allocate(4 * C);
  CHECK(a.stats().stitched_blocks.current == 1);
  a.deallocate(x);
  a.deallocate(x);
  CHECK(misuses == 1);
  CHECK(a.stats().invalid_frees == 1);
  CHECK(a.check_invariants());
  a.deallocate(f.p[1]);
  a.deallocate(f.p[3]);
  gmlake_test::check_released(a, 1);
}

// Regression: an alignment below 512 is raised to 512 only after the power-of-two
// check, so 3 or 100 gives nullptr as the contract says.
TEST_CASE("an alignment that is not a power of two gives nullptr, also below 512") {
  gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts(), one_slot());
  void* p = a.try_allocate(100, {}, 3);
  CHECK(p == nullptr);
  a.deallocate(p);
  void* q = a.try_allocate(100, {}, 100);
  CHECK(q == nullptr);
  a.deallocate(q);
  gmlake_test::check_released(a);
}

TEST_CASE("std::pmr::memory_resource") {
  gmlake::allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  gmlake::allocator<host_memfd> b(host_memfd(cap, C), opts(), one_slot());
  gmlake::memory_resource mr(a);
  gmlake::memory_resource other(b);
  {
    std::pmr::vector<int> v(&mr);
    for (int i = 0; i < 100000; ++i) v.push_back(i);
    long long sum = 0;
    for (int x : v) sum += x;
    CHECK(sum == 100000LL * 99999 / 2);
    CHECK(mr.allocator().stats().allocations.current == 1);
    std::pmr::vector<int> w(v.begin(), v.begin() + 10, &mr);
    CHECK(w[9] == 9);
  }
  CHECK(mr.allocator().stats().allocations.current == 0);
  CHECK(mr.is_equal(mr));
  CHECK(!mr.is_equal(other));
  CHECK(!mr.is_equal(*std::pmr::new_delete_resource()));
  CHECK(mr == mr);
  CHECK(mr != other);
  CHECK_THROWS_AS((void)mr.allocate(64, 3), gmlake::bad_alignment);
  CHECK_THROWS_AS((void)mr.allocate(64, 2 * C), gmlake::bad_alignment);
  try {
    const std::size_t odd = 768;
    (void)mr.allocate(64, odd);
    CHECK(false);
  } catch (const gmlake::bad_alignment& e) {
    CHECK(e.alignment() == 768);
  }
  CHECK_THROWS_AS((void)mr.allocate(cap + 1, 8), gmlake::out_of_memory);
  CHECK_THROWS_AS((void)mr.allocate(cap + 1, 8), std::bad_alloc);
  void* p = mr.allocate(100, C);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % C == 0);
  mr.deallocate(p, 100, C);
  auto on3 = mr.on(gmlake::host_stream{3});
  void* q = on3.allocate(2 * C, 64);
  on3.deallocate(q, 2 * C, 64);
  gmlake_test::check_released(a);
  gmlake_test::check_released(b);
}

TEST_CASE("std::pmr views on two streams share one allocator: one pool") {
  gmlake::allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  gmlake::memory_resource on1(a, gmlake::host_stream{1});
  gmlake::memory_resource on2 = on1.on(gmlake::host_stream{2});
  CHECK(&on1.allocator() == &on2.allocator());
  CHECK(on1.stream() == gmlake::host_stream{1});
  CHECK(on2.stream() == gmlake::host_stream{2});
  CHECK(!on1.is_equal(on2));  // a free through on2 would be on stream 2
  CHECK(on1.is_equal(gmlake::memory_resource(a, gmlake::host_stream{1})));
  const std::size_t n = 3 * C / sizeof(int);
  {
    std::pmr::vector<int> v1(n, 1, &on1);
    std::pmr::vector<int> v2(n, 2, &on2);
    const gmlake::statistics s = a.stats();
    CHECK(s.allocations.current == 2);  // both vectors, one allocator
    CHECK(s.requested_bytes.current == static_cast<std::int64_t>(6 * C));
    CHECK((v1.back() == 1 && v2.back() == 2));
  }
  // What both streams freed is one pool: serving stream 2 again needs no new memory.
  const std::int64_t reserved = a.stats().reserved_bytes.current;
  {
    std::pmr::vector<int> v3(2 * n, 3, &on2);
    CHECK(a.stats().reserved_bytes.current == reserved);
  }
  CHECK(a.stats().allocations.allocated == 3);
  gmlake_test::check_released(a);
}

TEST_CASE("errors") {
  static_assert(std::is_base_of_v<std::bad_alloc, gmlake::out_of_memory>);
  static_assert(std::is_base_of_v<std::bad_alloc, gmlake::bad_alignment>);
  static_assert(std::is_base_of_v<std::runtime_error, gmlake::backend_error>);
  gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts(), one_slot());
  try {
    (void)a.allocate(cap + 5);
    CHECK(false);
  } catch (const std::bad_alloc& e) {
    const auto* oom = dynamic_cast<const gmlake::out_of_memory*>(&e);
    REQUIRE(oom != nullptr);
    CHECK(oom->bytes() == cap + 5);
    CHECK(std::string(e.what()).size() > 0);
  }
  CHECK(a.chunk_size() == C);
  gmlake::options o = opts();
  o.chunk_size = 3 * C;  // rounded to a multiple of the granularity
  gmlake::gmlake_allocator<simulated> b(simulated(cap, C), o);
  CHECK(b.chunk_size() == 3 * C);
  o.chunk_size = C + 1;
  gmlake::gmlake_allocator<simulated> c(simulated(cap, C), o);
  CHECK(c.chunk_size() == 2 * C);
  gmlake_test::check_released(a);
}

TEST_CASE("growth creates chunks of up to max_chunk; parts of a chunk are reused") {
  policy::best_fit_pieces pol;
  pol.grow.max_chunk = 4 * C;
  gmlake::gmlake_allocator<counted_memfd> a(counted_memfd(cap, C), opts(), pol);
  const auto creates = a.backend().counts().calls_of(call::create);
  void* p = a.allocate(10 * C);  // 10 chunks: handles of 4, 4, 2 chunks
  CHECK(a.backend().counts().calls_of(call::create) == creates + 3);
  fill(p, 10 * C, 7);
  void* q = a.allocate(4 * C);
  void* r = a.allocate(2 * C);
  a.deallocate(p);
  void* keep = a.allocate(4 * C);  // takes one 4C handle of the freed range
  fill(keep, 4 * C, 9);
  const auto creates2 = a.backend().counts().calls_of(call::create);
  void* s = a.allocate(6 * C);  // the rest of the freed handles: no new memory
  CHECK(a.backend().counts().calls_of(call::create) == creates2);
  fill(s, 6 * C, 11);
  CHECK(holds(s, 6 * C, 11));
  CHECK(holds(keep, 4 * C, 9));
  CHECK(a.check_invariants());
  for (void* x : {s, keep, q, r}) a.deallocate(x);
  gmlake_test::check_released(a);
}

TEST_CASE("growth floor: the surplus of a small growth serves the next request; big growths use big chunks") {
  const gmlake::options o = opts();
  policy::best_fit_pieces pol;
  pol.grow.max_chunk = 16 * C;
  pol.grow.floor = 8 * C;
  pol.grow.floor_divisor = 0;
  pol.grow.big_growth = 64 * C;
  pol.grow.big_chunk = 32 * C;
  gmlake::gmlake_allocator<counting<simulated>> a(counting<simulated>(1024 * mib, C), o, pol);  // capacity/1024 = 16 C
  void* p = a.allocate(2 * C);
  CHECK(reserved(a) == static_cast<std::int64_t>(8 * C));
  const auto creates = a.backend().counts().calls_of(call::create);
  void* q = a.allocate(3 * C);  // in the surplus: nothing created
  CHECK(a.backend().counts().calls_of(call::create) == creates);
  void* big = a.allocate(100 * C);  // about 97 new chunks: handles of 32 C, not 16 C
  CHECK(a.backend().counts().calls_of(call::create) <= creates + 4);
  CHECK(a.check_invariants());
  for (void* x : {p, q, big}) a.deallocate(x);
  // A backend too small for the floor: growth creates what is needed.
  gmlake::gmlake_allocator<simulated> s(simulated(cap, C), o, pol);  // capacity/1024 < C: no floor
  void* r = s.allocate(2 * C);
  CHECK(reserved(s) == static_cast<std::int64_t>(2 * C));
  s.deallocate(r);
  // Policies without stitching grow by what is needed (exact_growth).
  gmlake::bfc_allocator<simulated> b(simulated(1024 * mib, C), o, one_slot<policy::no_stitch>());
  void* t = b.allocate(2 * C);
  CHECK(reserved(b) == static_cast<std::int64_t>(2 * C));
  b.deallocate(t);
  gmlake_test::check_released(a);
  gmlake_test::check_released(s);
  gmlake_test::check_released(b);
}

TEST_CASE("one chunk for a request: a growth that one request fills is one handle once settled, or when big") {
  policy::best_fit_pieces pol = sized(4 * C, 8 * C);
  pol.grow.big_growth = 64 * C;
  pol.grow.big_chunk = 16 * C;
  using A = gmlake::gmlake_allocator<counted_memfd>;
  const auto creates = [](A& a) { return a.backend().counts().calls_of(call::create); };
  for (const bool on : {true, false}) {
    CAPTURE(on);
    pol.grow.request_chunk = on;
    A a(counted_memfd(host_memfd(cap, C)), opts(), pol);
    // While the layout forms, a growth below big_growth keeps max_chunk: 24 C is six chunks.
    void* first = a.allocate(24 * C);
    CHECK(creates(a) == 6);
    // A big growth (64 C or more) that one request fills: one chunk, else chunks of 16 C.
    void* big = a.allocate(100 * C);
    CHECK(creates(a) == 6 + (on ? 1 : 7));
    fill(big, 100 * C, 3);
    CHECK(holds(big, 100 * C, 3));
    a.deallocate(big);
    a.deallocate(first);
    // Settle on a loop of 24 C, then grow for new shapes.
    for (int i = 0; i < 24; ++i) a.deallocate(a.allocate(24 * C));
    void* keep = a.allocate(100 * C);  // of the 124 C free: 24 C stay free, beside the hole
    auto before = creates(a);
    void* more = a.allocate(60 * C);  // that free range grown by the 36 C it lacks
    CHECK(fit(a.stats(), fit_state::s4_shortfall) >= 1);
    CHECK(creates(a) - before == (on ? 1 : 5));  // one chunk, not 4 x 8 C + 4 C
    before = creates(a);
    void* extra = a.allocate(40 * C);  // nothing free: a new range
    CHECK(creates(a) - before == (on ? 1 : 5));  // one chunk, not five of settled_max_chunk
    CHECK(reserved(a) == static_cast<std::int64_t>(200 * C));  // the same bytes either way
    fill(more, 60 * C, 4);
    fill(extra, 40 * C, 5);
    CHECK(holds(more, 60 * C, 4));
    CHECK(holds(extra, 40 * C, 5));
    CHECK(a.check_invariants());
    for (void* x : {more, extra, keep}) a.deallocate(x);
    gmlake_test::check_released(a);
  }
}

TEST_CASE("settled growth: once the footprint stops growing, growth creates larger chunks; release_cached starts over") {
  const policy::best_fit_pieces pol = sized(4 * C, 16 * C);
  // A loop that asks for the same 8 C again and again: its footprint stays 8 C; a
  // window is 2 x 8 C of requests, and the second window's judgement settles it.
  const auto loop = [](auto& a) {
    for (int i = 0; i < 4; ++i) a.deallocate(a.allocate(8 * C));
  };
  const auto creates_for_growth = [](auto& a) {  // a new shape: 16 C more
    const auto before = a.backend().counts().calls_of(call::create);
    void* keep = a.allocate(8 * C);
    void* more = a.allocate(16 * C);
    const auto made = a.backend().counts().calls_of(call::create) - before;
    a.deallocate(more);
    a.deallocate(keep);
    return made;
  };
  using A = gmlake::gmlake_allocator<counting<simulated>>;
  A a(counting<simulated>(cap, C), opts(), pol);
  loop(a);
  CHECK(creates_for_growth(a) == 1);  // one chunk of 16 C, not four of 4 C
  CHECK(a.check_invariants());
  CHECK(a.release_cached() == 24 * C);
  CHECK(creates_for_growth(a) == 2 + 4);  // a new layout forms: 4 C chunks again
  // settle_window 0: never settled.
  gmlake::options o = opts();
  o.settle_window = 0;
  A b(counting<simulated>(cap, C), o, pol);
  loop(b);
  CHECK(creates_for_growth(b) == 4);
  // Growth that goes on never settles: each window (2 x reserved of requests) ends
  // with a footprint 8 C larger than the last.
  A c(counting<simulated>(cap, C), opts(), pol);
  std::vector<void*> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(c.allocate(8 * C));
    for (int j = 0; j < 2 * (i + 1) - 1; ++j) c.deallocate(c.allocate(8 * C));
  }
  CHECK(creates_for_growth(c) == 4);  // keep reuses the loop's free 8 C; more: four 4 C chunks
  for (void* p : held) c.deallocate(p);
  gmlake_test::check_released(a);
  gmlake_test::check_released(b);
  gmlake_test::check_released(c);
}

TEST_CASE("small-arena growth: from its own size, in one chunk; its chunks go back whole") {
  // Slots of C = 64 KiB hold 64 requests of 1 KiB; small_cap is far above.
  policy::best_fit_pieces pol;
  pol.grow.small_divisor = 4;
  gmlake::gmlake_allocator<counting<simulated>> a(counting<simulated>(cap, C), opts(), pol);
  std::vector<void*> v;
  const auto fill_to = [&](std::size_t n) {
    while (v.size() < n) v.push_back(a.allocate(kib));
  };
  fill_to(64 * 4);  // up to 4 slots: each growth one slot (4 / 4 = 1)
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  CHECK(a.backend().counts().calls_of(call::create) == 4);
  fill_to(64 * 8);  // 5 slots after the next, then 6, 7, 8: still one slot each (5/4 .. 7/4 round down)
  CHECK(reserved(a) == static_cast<std::int64_t>(8 * C));
  CHECK(a.backend().counts().calls_of(call::create) == 8);
  v.push_back(a.allocate(kib));  // 8 / 4 = 2 slots, one chunk
  CHECK(reserved(a) == static_cast<std::int64_t>(10 * C));
  CHECK(a.backend().counts().calls_of(call::create) == 9);
  fill_to(64 * 10);  // the two-slot chunk holds the next 127: nothing created
  CHECK(a.backend().counts().calls_of(call::create) == 9);
  CHECK(a.breakdown().small_reserved == 10 * C);
  CHECK(a.check_invariants());
  // Freed, the two-slot chunk is one free chunk, released whole.
  for (void* p : v) a.deallocate(p);
  CHECK(a.check_invariants());
  gmlake_test::check_released(a);
  CHECK(a.backend().counts().calls_of(call::release) == 9);
}

TEST_CASE("small-arena growth: one live request keeps its whole chunk; exact growth stays one slot per chunk") {
  policy::best_fit_pieces pol;
  pol.grow.small_divisor = 1;  // each growth at least what the arena holds: 1, 1, 2, 4, 8 slots
  gmlake::gmlake_allocator<counting<simulated>> a(counting<simulated>(cap, C), opts(), pol);
  std::vector<void*> v;
  for (int i = 0; i < 64 * 16; ++i) v.push_back(a.allocate(kib));  // 16 slots: chunks of 1, 1, 2, 4, 8
  CHECK(a.breakdown().small_reserved == 16 * C);
  CHECK(a.backend().counts().calls_of(call::create) == 5);
  // Keep one request in the last chunk (8 slots), free the rest.
  void* keep = v.back();
  v.pop_back();
  for (void* p : v) a.deallocate(p);
  (void)a.release_cached();
  CHECK(a.breakdown().small_reserved == 8 * C);  // the whole chunk stays for one request
  CHECK(a.check_invariants());
  a.deallocate(keep);
  gmlake_test::check_released(a);

  // bfc (exact_growth): one slot per growth whatever the small arena holds.
  gmlake::bfc_allocator<counting<simulated>> b(counting<simulated>(cap, C), opts(), policy::no_stitch{});
  std::vector<void*> w;
  for (int i = 0; i < 64 * 16; ++i) w.push_back(b.allocate(kib));
  CHECK(b.breakdown().small_reserved == 16 * C);
  CHECK(b.backend().counts().calls_of(call::create) == 16);
  for (void* p : w) b.deallocate(p);
  gmlake_test::check_released(b);
}

TEST_CASE("lending to_small: a free large-arena chunk is released before the small arena grows past the peak") {
  policy::best_fit_pieces pol = one_slot();
  pol.grow.lends.to_small = true;
  gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts(), pol);
  void* p = a.allocate(4 * C);
  a.deallocate(p);
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  void* small = a.allocate(kib);  // the small arena needs a chunk: one large chunk goes first
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  CHECK(a.stats().lent_bytes == C);
  CHECK(a.check_invariants());
  void* q = a.allocate(3 * C);  // what is left of the large arena still serves
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  a.deallocate(q);
  a.deallocate(small);
  gmlake_test::check_released(a);
}

/// Policy and options with which a loop of 4 C requests settles the job: one slot
/// per chunk, borrowing of chunks up to 2 C.
policy::best_fit_pieces borrowing() {
  policy::best_fit_pieces pol = one_slot();
  pol.grow.lends.borrow_max = 2 * C;
  return pol;
}
template <class A>
void settle_at_4c(A& a) {
  for (int i = 0; i < 4; ++i) a.deallocate(a.allocate(4 * C));
}

TEST_CASE("borrowing: once settled, the small arena maps a free large-arena chunk instead of growing past the peak") {
  using A = gmlake::gmlake_allocator<counting<host_memfd>>;
  A a(counting<host_memfd>(cap, C), opts(), borrowing());
  settle_at_4c(a);
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  const auto creates = a.backend().counts().calls_of(call::create);
  auto* small = static_cast<unsigned char*>(a.allocate(kib));  // borrows: a map, no create
  std::memset(small, 0x5a, kib);
  CHECK(a.backend().counts().calls_of(call::create) == creates);
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  CHECK(a.stats().borrowed_bytes == C);
  CHECK(a.stats().mapped_bytes.current == static_cast<std::int64_t>(5 * C));  // the chunk is mapped twice
  CHECK(a.breakdown().small_reserved == C);
  CHECK(a.breakdown().large_reserved == 3 * C);
  CHECK(a.check_invariants());
  std::size_t small_chunks = 0;  // the snapshot shows the chunk once, as the small arena's
  a.visit_layout([&](const gmlake::layout_segment& g) { small_chunks += g.kind == gmlake::layout_segment::small_chunk; },
                 [](const gmlake::layout_piece&) {});
  CHECK(small_chunks == 1);
  void* more = a.allocate(2 * kib);  // the borrowed chunk serves further small requests
  CHECK(a.stats().borrowed_bytes == C);
  // The lent chunk is taken for the large arena: what is left of it still serves,
  // and a stitched block that mapped it cannot be claimed.
  void* big = a.allocate(3 * C);
  CHECK(reserved(a) == static_cast<std::int64_t>(4 * C));
  a.deallocate(big);
  void* bigger = a.allocate(4 * C);  // the small chunk is in use: the large arena grows
  CHECK(reserved(a) == static_cast<std::int64_t>(5 * C));
  CHECK(a.check_invariants());
  CHECK(small[0] == 0x5a);
  CHECK(small[kib - 1] == 0x5a);
  a.deallocate(bigger);
  a.deallocate(more);
  a.deallocate(small);
  // Free again in the small arena: given back (an unmap there) before the large arena
  // grows, which then needs no new chunk.
  const auto creates2 = a.backend().counts().calls_of(call::create);
  void* all = a.allocate(5 * C);
  CHECK(a.backend().counts().calls_of(call::create) == creates2);
  CHECK(reserved(a) == static_cast<std::int64_t>(5 * C));
  CHECK(a.breakdown().small_reserved == 0);
  CHECK(a.check_invariants());
  a.deallocate(all);
  gmlake_test::check_released(a);
  CHECK(a.backend().parent().mapping_count() == 0);
  CHECK(a.backend().parent().chunk_count() == 0);
}

TEST_CASE("borrowing: not before the job has settled, nor when off; release_cached gives borrowed chunks back") {
  using A = gmlake::gmlake_allocator<counting<simulated>>;
  {
    A a(counting<simulated>(cap, C), opts(), borrowing());
    a.deallocate(a.allocate(4 * C));  // one request: not settled
    void* small = a.allocate(kib);
    CHECK(reserved(a) == static_cast<std::int64_t>(5 * C));
    CHECK(a.stats().borrowed_bytes == 0);
    a.deallocate(small);
    gmlake_test::check_released(a);
  }
  {
    A a(counting<simulated>(cap, C), opts(), one_slot());  // borrow_max 0
    settle_at_4c(a);
    void* small = a.allocate(kib);
    CHECK(reserved(a) == static_cast<std::int64_t>(5 * C));
    CHECK(a.stats().borrowed_bytes == 0);
    a.deallocate(small);
    gmlake_test::check_released(a);
  }
  {
    A a(counting<simulated>(cap, C), opts(), borrowing());
    settle_at_4c(a);
    a.deallocate(a.allocate(kib));
    CHECK(a.stats().borrowed_bytes == C);
    CHECK(a.release_cached() == 4 * C);  // given back first, then released by the large arena
    CHECK(a.check_invariants());
    gmlake_test::check_released(a);
  }
  {  // destroyed while a chunk is borrowed: unmapped there, released here, nothing left
    counting<simulated> real(cap, C);
    {
      gmlake::gmlake_allocator<gmlake_test::borrowed<counting<simulated>>> a(gmlake_test::borrowed<counting<simulated>>(&real),
                                                                            opts(), borrowing());
      settle_at_4c(a);
      a.deallocate(a.allocate(kib));
      CHECK(a.stats().borrowed_bytes == C);
    }
    CHECK(real.parent().mapped_bytes() == 0);
    CHECK(real.parent().chunk_count() == 0);
  }
}

TEST_CASE("borrowing: never a chunk a stitched block maps, nor while the live bytes are near their peak") {
  using A = gmlake::gmlake_allocator<counting<simulated>>;
  {  // every free large chunk is under the cached stitched block x
    A a(counting<simulated>(cap, C), opts(), borrowing());
    taken_stitch<A> t(a, [](A&) {}, true);
    a.deallocate(t.taken);
    t.taken = nullptr;
    const auto peak = reserved(a);
    void* small = a.allocate(kib);  // the small arena grows past the peak instead
    CHECK(a.stats().borrowed_bytes == 0);
    CHECK(reserved(a) == peak + static_cast<std::int64_t>(C));
    void* y = a.allocate(4 * C);  // x is still whole: no new stitch
    CHECK(y == t.x);
    a.deallocate(y);
    a.deallocate(small);
    a.deallocate(t.f.p[1]);
    a.deallocate(t.f.p[3]);
    gmlake_test::check_released(a);
  }
  {  // settled at 5 chunks, 4 of them live: 4/5 of the peak
    A a(counting<simulated>(cap, C), opts(), borrowing());
    for (int i = 0; i < 4; ++i) a.deallocate(a.allocate(5 * C));
    void* hold = a.allocate(4 * C);
    void* small = a.allocate(kib);  // a free whole chunk is there, but not lent
    CHECK(a.stats().borrowed_bytes == 0);
    CHECK(reserved(a) == static_cast<std::int64_t>(6 * C));
    a.deallocate(small);
    a.deallocate(hold);
    gmlake_test::check_released(a);
  }
}

TEST_CASE("borrowing: a failed map, access or unmap leaves a consistent state, and the chunk goes back later") {
  using F = gmlake::backend::fault_injecting<counting<simulated>>;
  using gmlake::backend::fault;
  using A = gmlake::gmlake_allocator<F>;
  for (fault k : {fault::map, fault::set_access}) {  // the loan goes back; the small arena grows instead
    A a(F(cap, C), opts(), borrowing());
    settle_at_4c(a);
    a.backend().reset_counts();
    a.backend().fail_at(k, 1, gmlake::errc::driver);
    void* small = a.allocate(kib);
    CHECK(a.backend().injected() == 1);
    CHECK(a.stats().borrowed_bytes == 0);
    CHECK(reserved(a) == static_cast<std::int64_t>(5 * C));
    CHECK(a.check_invariants());
    a.deallocate(small);
    gmlake_test::check_released(a);
  }
  {  // set_access fails and so does the unmap that undoes the map: quarantined, then given back
    A a(F(cap, C), opts(), borrowing());
    settle_at_4c(a);
    a.backend().reset_counts();
    a.backend().fail_at(fault::set_access, 1, gmlake::errc::driver);
    a.backend().then_fail(fault::unmap);
    void* small = a.allocate(kib);
    CHECK(a.backend().injected() == 2);
    CHECK(a.stats().quarantined_bytes.current == static_cast<std::int64_t>(C));
    CHECK(a.check_invariants());
    a.deallocate(small);
    gmlake_test::check_released(a);  // retries the unmap: the chunk goes back and is released
    CHECK(a.stats().quarantined_bytes.current == 0);
    CHECK(a.backend().parent().parent().mapped_bytes() == 0);
  }
  {  // the unmap that gives it back fails: it stays borrowed, free, until a later give-back
    A a(F(cap, C), opts(), borrowing());
    settle_at_4c(a);
    a.deallocate(a.allocate(kib));
    CHECK(a.stats().borrowed_bytes == C);
    a.backend().reset_counts();
    a.backend().fail_at(fault::unmap, 1, gmlake::errc::driver);
    void* big = a.allocate(4 * C);  // give-back fails: the large arena grows
    CHECK(a.backend().injected() == 1);
    CHECK(reserved(a) == static_cast<std::int64_t>(5 * C));
    CHECK(a.breakdown().small_reserved == C);
    CHECK(a.check_invariants());
    a.deallocate(big);
    gmlake_test::check_released(a);
    CHECK(a.backend().parent().parent().mapped_bytes() == 0);
  }
}

TEST_CASE("lending never waits: a small chunk still in use by queued work is lent once that work is done") {
  gmlake::gmlake_allocator<simulated> a(simulated(cap, C), opts(), one_slot());
  a.backend().set_auto_complete(false);  // work on a stream stays queued until complete()
  void* small = a.allocate(kib);
  a.deallocate(small);  // its chunk is free, but queued work may still use it
  void* big = a.allocate(4 * C);  // past the peak: lending asks, does not wait, lends nothing
  auto s = a.stats();
  CHECK(s.stream_waits == 0);
  CHECK(s.lent_bytes == 0);
  CHECK(reserved(a) == static_cast<std::int64_t>(5 * C));
  a.deallocate(big);
  a.backend().complete(gmlake::host_stream{0});
  void* bigger = a.allocate(6 * C);  // past the peak again: the work is done, the chunk is lent
  s = a.stats();
  CHECK(s.stream_waits == 0);
  CHECK(s.lent_bytes == C);
  CHECK(reserved(a) == static_cast<std::int64_t>(6 * C));
  CHECK(a.check_invariants());
  a.deallocate(bigger);
  a.backend().complete(gmlake::host_stream{0});
  gmlake_test::check_released(a);
}

namespace {

/// Three chunks of 4 slots (max_chunk 4C): H1 = [p 1.5C used | 2.5C free],
/// `mid` used, H3 = [1.5C free at r | t 2.5C used]. No free range holds a whole
/// handle; H1's free end can open a stitch, H3's free start can close one.
template <class A>
struct edge_layout {
  unsigned char* p;
  void* mid;
  unsigned char* r;
  unsigned char* t;
  explicit edge_layout(A& a) {
    void* h1 = a.allocate(4 * C);
    mid = a.allocate(4 * C);
    void* h3 = a.allocate(4 * C);
    a.deallocate(h1);
    p = static_cast<unsigned char*>(a.allocate(C + C / 2));
    void* q = a.allocate(2 * C + C / 2);
    a.deallocate(h3);
    r = static_cast<unsigned char*>(a.allocate(C + C / 2));
    t = static_cast<unsigned char*>(a.allocate(2 * C + C / 2));
    CHECK((p == h1 && r == h3));
    a.deallocate(q);
    a.deallocate(r);
    fill(p, C + C / 2, 1);
    fill(t, 2 * C + C / 2, 2);
    fill(mid, 4 * C, 3);
  }
  [[nodiscard]] unsigned char* opening() const { return p + C + C / 2; }  // 2.5C free
  [[nodiscard]] bool neighbours_intact() const {
    return holds(p, C + C / 2, 1) && holds(t, 2 * C + C / 2, 2) && holds(mid, 4 * C, 3);
  }
  void free_all(A& a) {
    for (void* x : {static_cast<void*>(p), static_cast<void*>(t), mid}) a.deallocate(x);
  }
};

} // namespace

TEST_CASE("stitch edges: free bytes at handle boundaries open and close a stitch with new chunks") {
  // An 8C request takes H1's free end, 4C of new chunks, then H3's free start.
  for (const bool edges : {false, true}) {
    CAPTURE(edges);
    policy::best_fit_pieces p;
    p.grow.max_chunk = 4 * C;
    p.edges = edges ? 512 : 0;
    gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), p);
    edge_layout<decltype(a)> l(a);
    const auto s0 = a.stats();
    auto* y = static_cast<unsigned char*>(a.allocate(8 * C));
    const auto s1 = a.stats();
    fill(y, 8 * C, 7);
    if (edges) {
      CHECK(s1.reserved_bytes.current - s0.reserved_bytes.current == static_cast<std::int64_t>(4 * C));
      CHECK(fit(s1, fit_state::s4_shortfall) == fit(s0, fit_state::s4_shortfall) + 1);
      CHECK(s1.stitched_blocks.current == 1);
      // What is written through the block is in the edges, at their offsets in it.
      CHECK(holds(l.opening(), 2 * C + C / 2, 7));
      CHECK(holds(l.r, C + C / 2, 7, (2 * C + C / 2 + 4 * C) / 64));
      // ... and what is written in the edges is in the block.
      fill(l.r, C + C / 2, 8);
      CHECK(holds(y + 2 * C + C / 2 + 4 * C, C + C / 2, 8));
    } else {
      CHECK(s1.reserved_bytes.current - s0.reserved_bytes.current == static_cast<std::int64_t>(8 * C));
      CHECK(s1.stitched_blocks.current == 0);
    }
    CHECK(l.neighbours_intact());
    CHECK(a.check_invariants());
    a.deallocate(y);
    if (edges) {  // freed, the edges are free again and serve on their own
      void* q2 = a.allocate(2 * C + C / 2);
      CHECK(q2 == l.opening());
      a.deallocate(q2);
    }
    l.free_all(a);
    gmlake_test::check_released(a);
  }
}

TEST_CASE("a cached block whose end was taken serves again from an earlier start, with no driver call") {
  // The 8C block of edge_layout opens at H1's free end and closes at H3's free
  // start. Freed and cached; then H1's start is freed and H3's start taken: the block
  // serves 8C again from 1.5C earlier, over bytes of H1 it maps already.
  for (const bool slide : {true, false}) {
    CAPTURE(slide);
    policy::best_fit_pieces p;
    p.grow.max_chunk = 4 * C;
    p.edges = 512;
    gmlake::options o = opts();
    o.slide_cached = slide;
    gmlake::gmlake_allocator<counting<host_memfd>> a(counting<host_memfd>(cap, C), o, p);
    edge_layout<decltype(a)> l(a);
    auto* y = static_cast<unsigned char*>(a.allocate(8 * C));
    a.deallocate(y);
    a.deallocate(l.p);
    auto* r = static_cast<unsigned char*>(a.allocate(C + C / 2));  // H3's free start, exactly
    REQUIRE(r == l.r);
    fill(r, C + C / 2, 9);
    const auto calls = a.backend().counts().calls;
    const auto s0 = a.stats();
    auto* z = static_cast<unsigned char*>(a.allocate(8 * C));
    const auto s1 = a.stats();
    if (slide) {
      CHECK(z == y - (C + C / 2));
      CHECK(s1.cached_stitch_hits == s0.cached_stitch_hits + 1);
      CHECK(a.backend().counts().calls == calls);  // no driver call
      CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
      fill(z, 8 * C, 10);
      CHECK(holds(l.p, 4 * C, 10));  // its first 4C are H1, from its start
      CHECK(holds(r, C + C / 2, 9));  // H3's start is not in it
    } else {
      CHECK(z != y);
      CHECK(s1.cached_stitch_hits == s0.cached_stitch_hits);
      CHECK(a.backend().counts().calls != calls);
    }
    CHECK(holds(l.t, 2 * C + C / 2, 2));
    CHECK(holds(l.mid, 4 * C, 3));
    CHECK(a.check_invariants());
    a.deallocate(z);
    a.deallocate(r);
    a.deallocate(l.t);
    a.deallocate(l.mid);
    gmlake_test::check_released(a);
  }
}

TEST_CASE("stitch edges by default: 4 MiB at chunk boundaries close a stitch without new chunks, 3 MiB do not") {
  // 2 MiB slots, chunks of 16 MiB: H1 = [used | free E], H2 used, H3 free, H4 used,
  // H5 = [free E | used]. A request of E + 16 MiB + E can only be stitched from H1's
  // free end, H3 and H5's free start.
  for (const std::size_t e : {5 * mib, 3 * mib}) {
    for (const bool off : {false, true}) {
      CAPTURE(e);
      CAPTURE(off);
      policy::best_fit_pieces p;
      CHECK(p.edges == 4 * mib);
      if (off) p.edges = 0;
      gmlake::gmlake_allocator<simulated> a(simulated(1024 * mib, 2 * mib), gmlake::options{}, p);
      void* h[5];
      for (void*& x : h) x = a.allocate(16 * mib);
      a.deallocate(h[4]);
      void* filler = a.allocate(e);
      void* y5 = a.allocate(16 * mib - e);
      a.deallocate(filler);
      a.deallocate(h[0]);
      void* x1 = a.allocate(16 * mib - e);
      CHECK(x1 == h[0]);
      a.deallocate(h[2]);
      const auto s0 = a.stats();
      void* y = a.allocate(16 * mib + 2 * e);
      const auto s1 = a.stats();
      REQUIRE(y != nullptr);
      if (e >= 4 * mib && !off) {
        CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
        CHECK(fit(s1, fit_state::s3_stitch) == fit(s0, fit_state::s3_stitch) + 1);
      } else {
        CHECK(s1.reserved_bytes.current > s0.reserved_bytes.current);
        CHECK(fit(s1, fit_state::s3_stitch) == fit(s0, fit_state::s3_stitch));
      }
      CHECK(a.check_invariants());
      for (void* x : {y, y5, x1, h[1], h[3]}) a.deallocate(x);
      CHECK(a.check_invariants());
    }
  }
}

TEST_CASE("stitch edges: a closing edge instead of the last piece's tail; after new chunks with a surplus") {
  policy::best_fit_pieces p;
  p.grow.max_chunk = 4 * C;
  p.edges = 512;
  p.grow.floor = 4 * C;  // growth creates at least one 4C chunk (capacity / 1024 allows it)
  p.grow.floor_divisor = 0;
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(256 * mib, C), opts(), p);
  SUBCASE("S3: the closing edge gives more than the tail, no new chunks") {
    // H1 free and 0.5C of H2 after it, H2's rest used; H3 = [2C free | 2C used].
    void* h1 = a.allocate(4 * C);
    void* h2 = a.allocate(4 * C);
    void* h3 = a.allocate(4 * C);
    a.deallocate(h2);
    void* b1 = a.allocate(C / 2);
    void* b2 = a.allocate(3 * C + C / 2);
    a.deallocate(h3);
    auto* c1 = static_cast<unsigned char*>(a.allocate(2 * C));
    void* c2 = a.allocate(2 * C);
    CHECK((b1 == h2 && c1 == h3));
    a.deallocate(b1);
    a.deallocate(c1);
    a.deallocate(h1);  // [H1 | 0.5C of H2] free: one whole handle and a 0.5C tail
    fill(b2, 3 * C + C / 2, 1);
    fill(c2, 2 * C, 2);
    const auto s0 = a.stats();
    auto* y = static_cast<unsigned char*>(a.allocate(6 * C));
    const auto s1 = a.stats();
    CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
    CHECK(fit(s1, fit_state::s3_stitch) == fit(s0, fit_state::s3_stitch) + 1);
    fill(y, 6 * C, 7);
    CHECK(holds(h1, 4 * C, 7));
    CHECK(holds(c1, 2 * C, 7, 4 * C / 64));
    CHECK(holds(b2, 3 * C + C / 2, 1));
    CHECK(holds(c2, 2 * C, 2));
    CHECK(a.check_invariants());
    for (void* x : {static_cast<void*>(y), b2, c2}) a.deallocate(x);
  }
  for (const std::size_t request : {6 * C, 7 * C}) {
    SUBCASE(request == 6 * C ? "S4: the new handle's surplus replaces the closing edge"
                             : "S4: the new handle's surplus shortens the closing edge") {
      // 6C needs 2C new (3.5C less the 1.5C edge), 7C needs 3C; growth creates a 4C
      // handle either way.
      edge_layout<decltype(a)> l(a);
      fill(l.r, C + C / 2, 4);
      const auto s0 = a.stats();
      auto* y = static_cast<unsigned char*>(a.allocate(request));
      const auto s1 = a.stats();
      CHECK(s1.reserved_bytes.current - s0.reserved_bytes.current == static_cast<std::int64_t>(4 * C));
      CHECK(fit(s1, fit_state::s4_shortfall) == fit(s0, fit_state::s4_shortfall) + 1);
      fill(y, request, 7);
      CHECK(holds(y, request, 7));
      CHECK(holds(l.opening(), 2 * C + C / 2, 7));
      if (request == 6 * C) {
        CHECK(holds(l.r, C + C / 2, 4));  // not used: the surplus served instead
      } else {
        CHECK(holds(l.r, C / 2, 7, (2 * C + C / 2 + 4 * C) / 64));  // its first 0.5C only
        CHECK(holds(l.r + C / 2, C, 4, C / 2 / 64));
      }
      CHECK(l.neighbours_intact());
      CHECK(a.check_invariants());
      a.deallocate(y);
      l.free_all(a);
    }
  }
  gmlake_test::check_released(a);
}

TEST_CASE("append: a request larger than a cached stitched block maps only the missing chunks after it") {
  // Chunks of one slot: X1 Y1 X2 Y2 Z; X1 and X2 stitched into S (2C), S freed and
  // cached, Z freed. A 3C request is S with Z appended: one map, one set access, no
  // new reservation, no new memory; Z's bytes are the block's last C.
  for (const std::size_t room : {std::size_t{1}, std::size_t{0}}) {
    CAPTURE(room);
    auto o = opts();
    o.append_room = room;
    gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), o, one_slot());
    void* x1 = a.allocate(C);
    void* y1 = a.allocate(C);
    void* x2 = a.allocate(C);
    void* y2 = a.allocate(C);
    void* z = a.allocate(C);
    a.deallocate(x1);
    a.deallocate(x2);
    void* s = a.allocate(2 * C);
    a.deallocate(s);
    a.deallocate(z);
    fill(y1, C, 1);
    fill(y2, C, 2);
    const auto s0 = a.stats();
    auto* t = static_cast<unsigned char*>(a.allocate(3 * C));
    const auto s1 = a.stats();
    REQUIRE(t != nullptr);
    const auto calls = [](const gmlake::statistics& st, call c) { return st.calls[static_cast<std::size_t>(c)]; };
    CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
    CHECK(fit(s1, fit_state::s3_stitch) == fit(s0, fit_state::s3_stitch) + 1);
    if (room != 0) {
      CHECK(t == s);
      CHECK(s1.cached_stitch_appends == s0.cached_stitch_appends + 1);
      CHECK(calls(s1, call::reserve) == calls(s0, call::reserve));
      CHECK(calls(s1, call::map) == calls(s0, call::map) + 1);
      CHECK(calls(s1, call::set_access) == calls(s0, call::set_access) + 1);
      CHECK(s1.stitched_blocks.current == 1);
      fill(t, 3 * C, 7);
      // The block's parts, through the chunks' own addresses: X1 and X2 (in the
      // planner's order), then Z.
      CHECK(((holds(x1, C, 7) && holds(x2, C, 7, C / 64)) || (holds(x2, C, 7) && holds(x1, C, 7, C / 64))));
      CHECK(holds(z, C, 7, 2 * C / 64));
    } else {  // no room: stitched anew, three chunks mapped into a new reservation
      CHECK(s1.cached_stitch_appends == 0);
      CHECK(calls(s1, call::reserve) == calls(s0, call::reserve) + 1);
      CHECK(calls(s1, call::map) == calls(s0, call::map) + 3);
      CHECK(s1.stitched_blocks.current == 2);
    }
    CHECK(holds(y1, C, 1));
    CHECK(holds(y2, C, 2));
    CHECK(a.check_invariants());
    a.deallocate(t);
    // Freed, the appended block serves 3C again with no backend call.
    const auto s2 = a.stats();
    void* again = a.allocate(3 * C);
    CHECK(again == t);
    CHECK(a.stats().calls == s2.calls);
    a.deallocate(again);
    a.deallocate(y1);
    a.deallocate(y2);
    gmlake_test::check_released(a);
  }
}
