// tests/test_stitch_pool.cpp - detail::stitch_pool over one arena of the simulated
// backend: build, claim, release, the cache, eviction by a policy's victim, and the
// stitch reference counts its check() compares with the arena's slots.
#include <doctest/doctest.h>

#include <cstddef>
#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gmlake/backend/counting.hpp"
#include "gmlake/backend/fault_injecting.hpp"
#include "gmlake/backend/simulated.hpp"
#include "gmlake/detail/stitch_pool.hpp"
#include "gmlake/policy/eviction.hpp"

namespace {

using gmlake::call;
using gmlake::backend::counting;
using gmlake::backend::simulated;
using driver = counting<simulated>;
namespace detail = gmlake::detail;
namespace policy = gmlake::policy;

constexpr std::size_t S = 64 * 1024;
constexpr std::size_t K = 4 * S;  // chunks of 4 slots

/// One large arena with 8 chunks of K, all free, and a pool on it, over backend D.
template <class D>
struct basic_bench {
  D backend{simulated(std::size_t{64} << 20, S)};
  detail::footprint held;
  detail::node_pool<detail::range> nodes;
  detail::stream_table<D> streams{backend};
  detail::arena<D> large{backend, nodes, streams, held, S};
  detail::stitch_pool<D> pool{backend, large, streams, nodes, held};
  std::uintptr_t base = 0;

  basic_bench() {
    REQUIRE(large.open(std::size_t{64} << 20) == gmlake::errc::ok);
    REQUIRE(nodes.reserve(4));
    std::uintptr_t fresh = 0;
    REQUIRE(large.grow(8 * K, 0, fresh, gmlake::growth_plan{0, K, 0, 0}));
    base = fresh;
  }
  ~basic_bench() {
    pool.close();
    large.close();
  }
  /// Every structural property, the pool's and the arena's.
  bool sound() const {
    std::size_t reserved = 0, used = 0, live = 0, pool_live = 0;
    return large.check(reserved, used, live) && pool.check(pool_live);
  }
  /// Stitched blocks of two chunks: chunk i then chunk j.
  detail::stitch_block* two(std::size_t i, std::size_t j) {
    const detail::stitch_piece pieces[] = {{base + i * K, K}, {base + j * K, K}};
    return pool.build(pieces);
  }
};
using bench = basic_bench<driver>;

} // namespace

TEST_CASE("stitch pool: build maps the pieces side by side and pins their chunks") {
  bench b;
  const auto maps = b.backend.counts().calls_of(call::map);
  detail::stitch_block* x = b.two(0, 2);
  REQUIRE(x != nullptr);
  CHECK(b.backend.counts().calls_of(call::map) == maps + 2);
  CHECK(x->mapped == 2 * K);
  CHECK(x->capacity == 2 * K);
  CHECK(b.held.stitched.current == 1);
  CHECK(b.pool.find(x->pointer) == x);
  CHECK(b.pool.find(x->pointer + 512) == nullptr);
  CHECK(b.large.slot_of(b.base).stitch_refs == 1);
  CHECK(b.large.slot_of(b.base + K).stitch_refs == 0);
  CHECK(b.large.slot_of(b.base + 2 * K + S).stitch_refs == 1);
  // Built, neither in use nor cached: the check wants it in one of the two.
  b.pool.discard(*x);
  CHECK(b.held.stitched.current == 0);
  CHECK(b.sound());
}

TEST_CASE("stitch pool: claim, release to the cache, reuse from it") {
  bench b;
  detail::stitch_block* x = b.two(1, 3);
  REQUIRE(x != nullptr);
  REQUIRE(b.pool.claim(*x, K + S, K + 100, 0));
  CHECK(x->in_use);
  CHECK(x->claimed_count == 2);
  CHECK(b.sound());
  // The claimed arena bytes are used now: a second block over chunk 1 cannot claim.
  detail::stitch_block* y = b.two(1, 5);
  REQUIRE(y != nullptr);
  CHECK(!b.pool.claim(*y, 2 * K, 2 * K, 0));
  b.pool.discard(*y);
  b.pool.release(*x, b.streams.on_free(0));
  CHECK(b.pool.cached_count() == 1);
  CHECK(b.pool.cached_bytes() == 2 * K);
  CHECK(b.sound());
  CHECK(b.pool.reuse(4 * K, 4 * K, 0, 8) == nullptr);  // too large for it
  CHECK(b.pool.reuse(2 * K, 2 * K, 0, 8) == x);
  CHECK(b.pool.cached_count() == 0);
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  b.pool.unmap_cached();
  CHECK(b.held.stitched.current == 0);
  CHECK(b.large.slot_of(b.base + K).stitch_refs == 0);
  CHECK(b.sound());
}

namespace {

/// Evicts the most recently used block: a policy the allocator knows nothing of.
struct evict_newest {
  bool over_capacity(gmlake::stitch_cache_view v) const noexcept { return v.inactive_blocks > 1; }
  gmlake::stitch_info victim(const gmlake::stitch_cache_entries& e) const noexcept {
    return e.at(e.by_age, e.size() - 1);
  }
};
static_assert(gmlake::EvictionPolicy<evict_newest>);

} // namespace

TEST_CASE("stitch pool: eviction unmaps the victim the policy picks from the cache") {
  bench b;
  detail::stitch_block* x = b.two(0, 2);
  const detail::stitch_piece three[] = {{b.base + 4 * K, K}, {b.base + 6 * K, K}, {b.base + 1 * K, K}};
  detail::stitch_block* y = b.pool.build(three);
  detail::stitch_block* z = b.two(3, 5);
  REQUIRE((x && y && z));
  for (auto* s : {x, y, z}) REQUIRE(b.pool.claim(*s, K, K, 0));
  for (auto* s : {x, y, z}) b.pool.release(*s, b.streams.on_free(0));
  REQUIRE(b.pool.cached_count() == 3);
  const std::uintptr_t px = x->pointer, py = y->pointer, pz = z->pointer;

  SUBCASE("the policy's own choice: the newest goes, until one is left") {
    CHECK(b.pool.evict(evict_newest{}) == 2);
    CHECK(b.pool.find(pz) == nullptr);
    CHECK(b.pool.find(py) == nullptr);
    CHECK(b.pool.find(px) != nullptr);
  }
  SUBCASE("evict_largest: the largest goes first") {
    CHECK(b.pool.evict(policy::evict_largest{4 * K, 4096}) == 1);
    CHECK(b.pool.find(py) == nullptr);
    CHECK(b.pool.cached_bytes() == 4 * K);
  }
  SUBCASE("lru: the least recently used goes first") {
    CHECK(b.pool.evict(policy::lru{5 * K, 4096}) == 1);
    CHECK(b.pool.find(px) == nullptr);
    CHECK(b.pool.find(py) != nullptr);
  }
  SUBCASE("no_cache: all go") {
    CHECK(b.pool.evict(policy::no_cache{}) == 3);
    CHECK(b.pool.cached_count() == 0);
  }
  CHECK(b.sound());
}

TEST_CASE("stitch pool: check() finds a stitch reference count that does not match the blocks") {
  bench b;
  detail::stitch_block* x = b.two(0, 2);
  REQUIRE(x != nullptr);
  REQUIRE(b.pool.claim(*x, 2 * K, 2 * K, 0));
  std::size_t live = 0;
  CHECK(b.pool.check(live));
  CHECK(live == 1);
  b.large.pin(b.base + K, b.base + K + 1, 1);  // a count with no block behind it
  live = 0;
  CHECK(!b.pool.check(live));
  b.large.pin(b.base + K, b.base + K + 1, -1);
  live = 0;
  CHECK(b.pool.check(live));
  b.pool.release(*x, b.streams.on_free(0));
}

namespace {

/// A cached block over chunks 0 and 2 (its first piece from `head` bytes into chunk
/// 0), whose chunk 0 is then partly taken (one slot at `taken`); chunks 1 and 3-7
/// taken too unless `spare_k`, in which case they stay free.
struct taken_block {
  bench& b;
  detail::stitch_block* x = nullptr;
  std::vector<detail::range*> used;
  taken_block(bench& bb, std::size_t head, std::uintptr_t taken, bool spare_k) : b(bb) {
    const detail::stitch_piece pieces[] = {{b.base + head, K - head}, {b.base + 2 * K, K}};
    x = b.pool.build(pieces);
    REQUIRE(x != nullptr);
    REQUIRE(b.pool.claim(*x, 2 * K - head, 2 * K - head, 0));
    b.pool.release(*x, b.streams.on_free(0));
    take(taken, S);
    if (!spare_k)
      for (std::size_t i : {1, 3, 4, 5, 6, 7}) take(b.base + i * K, K);
  }
  void take(std::uintptr_t at, std::size_t n) {
    REQUIRE(b.nodes.reserve(2));
    used.push_back(&b.large.carve(b.large.holding(at), at, n));
  }
  /// Four more chunks of one slot each: free, after chunk 7.
  std::uintptr_t grow_slots() {
    REQUIRE(b.nodes.reserve(2));
    std::uintptr_t fresh = 0;
    REQUIRE(b.large.grow(4 * S, 0, fresh, gmlake::growth_plan{0, S, 0, 0}));
    return fresh;
  }
  void give_back() {
    for (auto* r : used) b.large.release(*r, b.streams.on_free(0));
  }
};

std::uint64_t calls(bench& b, call c) { return b.backend.counts().calls_of(c); }
std::uint64_t all_calls(bench& b) {
  const auto& c = b.backend.counts().calls;
  return std::accumulate(c.begin(), c.end(), std::uint64_t{0});
}

} // namespace

TEST_CASE("stitch pool: repair replaces a taken chunk by a free one of the same bytes, then claims") {
  bench b;
  taken_block t(b, 0, b.base + S, true);
  detail::stitch_block* x = t.x;
  CHECK(b.pool.reuse(2 * K, 2 * K, 0, 8) == nullptr);  // chunk 0 is partly used
  const auto maps = calls(b, call::map), unmaps = calls(b, call::unmap), access = calls(b, call::set_access);
  const std::uintptr_t pointer = x->pointer;
  CHECK(b.pool.repair(2 * K, 2 * K, 0, 8, 512, 4) == x);
  CHECK(x->in_use);
  CHECK(x->pointer == pointer);
  CHECK(calls(b, call::unmap) == unmaps + 1);
  CHECK(calls(b, call::map) == maps + 1);
  CHECK(calls(b, call::set_access) == access + 1);
  REQUIRE(x->pieces.size() == 2);
  CHECK(x->pieces[0].addr != b.base);  // a free chunk of K elsewhere
  CHECK(x->pieces[0].size == K);
  CHECK(x->pieces[1].addr == b.base + 2 * K);
  CHECK(b.large.slot_of(b.base).stitch_refs == 0);
  CHECK(b.large.slot_of(x->pieces[0].addr).stitch_refs == 1);
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  t.give_back();
  CHECK(b.sound());
}

TEST_CASE("stitch pool: repair by several smaller chunks; not at a piece's edge") {
  bench b;
  SUBCASE("a whole chunk inside its piece: four chunks of one slot replace it") {
    taken_block t(b, 0, b.base + S, false);
    const std::uintptr_t fresh = t.grow_slots();
    const auto maps = calls(b, call::map);
    REQUIRE(b.pool.repair(2 * K, 2 * K, 0, 8, 512, 4) == t.x);
    CHECK(calls(b, call::map) == maps + 4);
    REQUIRE(t.x->pieces.size() == 5);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(t.x->pieces[i].size == S);
      CHECK(b.large.slot_of(t.x->pieces[i].addr).stitch_refs == 1);
      CHECK((t.x->pieces[i].addr >= fresh && t.x->pieces[i].addr < fresh + 4 * S));
    }
    CHECK(b.sound());
    b.pool.release(*t.x, b.streams.on_free(0));
    t.give_back();
  }
  SUBCASE("a chunk at the first piece's start (the block opens inside it): only one of the same bytes would do") {
    taken_block t(b, S, b.base + 2 * S, false);
    (void)t.grow_slots();
    const auto maps = calls(b, call::map), unmaps = calls(b, call::unmap);
    CHECK(b.pool.repair(2 * K - S, 2 * K - S, 0, 8, 512, 4) == nullptr);
    CHECK(calls(b, call::map) == maps);
    CHECK(calls(b, call::unmap) == unmaps);
    CHECK(t.x->cached);
    CHECK(b.sound());
    t.give_back();
  }
  SUBCASE("the same, with a free chunk of the same bytes: the head's offset is kept") {
    taken_block t(b, S, b.base + 2 * S, true);
    const std::uintptr_t pointer = t.x->pointer;
    REQUIRE(b.pool.repair(2 * K - S, 2 * K - S, 0, 8, 512, 4) == t.x);
    CHECK(t.x->pointer == pointer);
    CHECK(b.large.chunk_floor(t.x->pieces[0].addr) + S == t.x->pieces[0].addr);
    CHECK(b.sound());
    b.pool.release(*t.x, b.streams.on_free(0));
    t.give_back();
  }
  SUBCASE("more chunks taken than allowed: nothing changes") {
    taken_block t(b, 0, b.base + S, true);
    t.take(b.base + 2 * K, S);
    CHECK(b.pool.repair(2 * K, 2 * K, 0, 8, 512, 1) == nullptr);
    CHECK(b.pool.repair(2 * K, 2 * K, 0, 8, 512, 2) == t.x);
    b.pool.release(*t.x, b.streams.on_free(0));
    t.give_back();
  }
  CHECK(b.sound());
}

namespace {

/// Takes arena bytes [at, at + n), free now: a used range, to release later.
template <class Bench>
detail::range& taken(Bench& b, std::uintptr_t at, std::size_t n) {
  REQUIRE(b.nodes.reserve(2));
  return b.large.carve(b.large.holding(at), at, n);
}

/// A cached block over chunks 0 and 2, its first piece from `head` bytes into chunk 0
/// (so the bytes before it are mapped in the block too), claimed once at `size`.
detail::stitch_block* headed(bench& b, std::size_t head, std::size_t size) {
  const detail::stitch_piece pieces[] = {{b.base + head, K - head}, {b.base + 2 * K, K}};
  detail::stitch_block* x = b.pool.build(pieces);
  REQUIRE(x != nullptr);
  REQUIRE(b.pool.claim(*x, size, size, 0));
  b.pool.release(*x, b.streams.on_free(0));
  return x;
}

} // namespace

TEST_CASE("stitch pool: slide: a block whose end was taken starts earlier in its first chunk, with no call") {
  bench b;
  detail::stitch_block* x = headed(b, 2 * S, 2 * K - 2 * S);
  const std::uintptr_t pointer = x->pointer;
  detail::range& last = taken(b, b.base + 2 * K + 3 * S, S);
  CHECK(b.pool.reuse(2 * K - 2 * S, 2 * K - 2 * S, 0, 8) == nullptr);  // its last slot is taken
  const auto before = all_calls(b);
  REQUIRE(b.pool.slide(2 * K - 2 * S, 2 * K - 2 * S, 0, 8) == x);
  CHECK(all_calls(b) == before);  // no driver call: the bytes before the piece are mapped
  CHECK(x->in_use);
  CHECK(x->pointer == pointer - S);  // back by what the request lacks, no more
  CHECK(x->pieces[0].addr == b.base + S);
  CHECK(x->pieces[0].size == K - S);
  CHECK(x->capacity == 2 * K - S);
  CHECK(b.pool.find(x->pointer) == x);
  CHECK(b.pool.find(pointer) == nullptr);
  CHECK(b.large.holding(b.base + S).owner == x);
  CHECK(b.large.holding(b.base + 2 * K).owner == x);
  CHECK(b.large.holding(b.base).is_free());
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  b.large.release(last, b.streams.on_free(0));
  CHECK(b.pool.reuse(2 * K - S, 2 * K - S, 0, 8) == x);  // it keeps its new start
  b.pool.release(*x, b.streams.on_free(0));
  CHECK(b.sound());
}

TEST_CASE("stitch pool: slide: a block whose first bytes were taken starts later, where its capacity allows") {
  bench b;
  detail::stitch_block* x = headed(b, S, 2 * K - 2 * S);
  const std::uintptr_t pointer = x->pointer;
  detail::range& first = taken(b, b.base + S, S);
  CHECK(b.pool.reuse(2 * K - 2 * S, 2 * K - 2 * S, 0, 8) == nullptr);
  CHECK(b.pool.slide(2 * K - S, 2 * K - S, 0, 8) == nullptr);  // would need more than it holds
  CHECK(x->pointer == pointer);
  const auto before = all_calls(b);
  REQUIRE(b.pool.slide(2 * K - 2 * S, 2 * K - 2 * S, 0, 8) == x);
  CHECK(all_calls(b) == before);
  CHECK(x->pointer == pointer + S);
  CHECK(x->pieces[0].addr == b.base + 2 * S);
  CHECK(x->capacity == 2 * K - 2 * S);
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  b.large.release(first, b.streams.on_free(0));
  CHECK(b.sound());
}

TEST_CASE("stitch pool: a start moved back stops at another piece of the block in the same chunk") {
  // First piece: chunk 1 from its third slot, and chunk 2; then chunks 4-5; last,
  // chunk 0 and chunk 1's first slot (a stitch may end in its first piece's chunk).
  // Once the used slot between them is free, one free range holds both.
  bench b;
  detail::range& gap = taken(b, b.base + K + S, S);
  const detail::stitch_piece pieces[] = {{b.base + K + 2 * S, 2 * K - 2 * S}, {b.base + 4 * K, 2 * K}, {b.base, K + S}};
  detail::stitch_block* x = b.pool.build(pieces);
  REQUIRE(x != nullptr);
  REQUIRE(b.pool.claim(*x, x->capacity, x->capacity, 0));
  b.pool.release(*x, b.streams.on_free(0));
  b.large.release(gap, b.streams.on_free(0));
  detail::range& tail = taken(b, b.base + 6 * K - S, S);
  SUBCASE("the request lacks more than the slot between them: not moved") {
    CHECK(b.pool.slide(4 * K - S, 4 * K - S, 0, 8) == nullptr);
    CHECK(x->pieces[0].addr == b.base + K + 2 * S);
  }
  SUBCASE("it lacks that slot: moved onto it, no further") {
    REQUIRE(b.pool.slide(4 * K - 2 * S, 4 * K - 2 * S, 0, 8) == x);
    CHECK(x->pieces[0].addr == b.base + K + S);
    CHECK(b.sound());  // the pieces stay disjoint
    b.pool.release(*x, b.streams.on_free(0));
  }
  b.large.release(tail, b.streams.on_free(0));
  REQUIRE(b.nodes.reserve(8));
  REQUIRE(b.pool.reuse(x->capacity, x->capacity, 0, 8) == x);  // every piece claimed once
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  CHECK(b.sound());
}

TEST_CASE("stitch pool: slide off, or no free bytes before the piece: the block stays as stitched") {
  bench b;
  detail::stitch_block* x = headed(b, 2 * S, 2 * K - 2 * S);
  const std::uintptr_t pointer = x->pointer;
  detail::range& last = taken(b, b.base + 2 * K + 3 * S, S);
  SUBCASE("off") {
    b.pool.set_slide(false);
    CHECK(b.pool.slide(2 * K - 2 * S, 2 * K - 2 * S, 0, 8) == nullptr);
  }
  SUBCASE("the slot before the piece taken") {
    detail::range& before = taken(b, b.base + S, S);
    CHECK(b.pool.slide(2 * K - 2 * S, 2 * K - 2 * S, 0, 8) == nullptr);
    b.large.release(before, b.streams.on_free(0));
  }
  CHECK(x->cached);
  CHECK(x->pointer == pointer);
  CHECK(x->pieces[0].addr == b.base + 2 * S);
  b.large.release(last, b.streams.on_free(0));
  CHECK(b.sound());
}

namespace {

/// A cached block over chunks 0 (from its third slot), 2, 4 and 6, claimed whole
/// once; then a slot inside chunk 2 and chunk 6's last slot taken. Whole, it needs
/// both replaced; from chunk 0's start, only chunk 2.
template <class Bench>
struct two_taken {
  Bench& b;
  detail::stitch_block* x = nullptr;
  std::size_t size = 0;
  std::uintptr_t pointer = 0;
  detail::range* inner = nullptr;
  detail::range* end = nullptr;
  explicit two_taken(Bench& bb) : b(bb) {
    const detail::stitch_piece pieces[] = {
        {b.base + 2 * S, K - 2 * S}, {b.base + 2 * K, K}, {b.base + 4 * K, K}, {b.base + 6 * K, K}};
    x = b.pool.build(pieces);
    REQUIRE(x != nullptr);
    size = x->capacity;
    REQUIRE(b.pool.claim(*x, size, size, 0));
    b.pool.release(*x, b.streams.on_free(0));
    pointer = x->pointer;
    inner = &taken(b, b.base + 2 * K + S, S);
    end = &taken(b, b.base + 6 * K + 3 * S, S);
  }
  void give_back() {
    b.large.release(*inner, b.streams.on_free(0));
    b.large.release(*end, b.streams.on_free(0));
  }
};

} // namespace

TEST_CASE("stitch pool: repair from an earlier start, where that leaves fewer chunks to replace") {
  bench b;
  bool slide = true;
  SUBCASE("on") {}
  SUBCASE("off: both taken chunks replaced, the start kept") {
    slide = false;
    b.pool.set_slide(false);
  }
  two_taken t(b);
  detail::stitch_block* x = t.x;
  const std::size_t size = t.size;
  const std::uintptr_t pointer = t.pointer;
  CHECK(b.pool.slide(size, size, 0, 8) == nullptr);  // chunk 2 is taken inside
  const auto maps = calls(b, call::map), unmaps = calls(b, call::unmap);
  REQUIRE(b.pool.repair(size, size, 0, 8, 512, 4) == x);
  if (slide) {
    CHECK(calls(b, call::unmap) == unmaps + 1);  // chunk 2 only: chunk 6's taken slot is past the request now
    CHECK(calls(b, call::map) == maps + 1);
    CHECK(x->pointer == pointer - 2 * S);
    CHECK(x->pieces[0].addr == b.base);
    CHECK(b.large.holding(b.base + 6 * K).owner == x);
  } else {
    CHECK(calls(b, call::unmap) == unmaps + 2);  // chunks 2 and 6
    CHECK(calls(b, call::map) == maps + 2);
    CHECK(x->pointer == pointer);
    CHECK(x->pieces[0].addr == b.base + 2 * S);
  }
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  t.give_back();
  CHECK(b.sound());
}

TEST_CASE("stitch pool: a repair from an earlier start whose map fails is undone: cached, moved, sound") {
  basic_bench<gmlake::backend::fault_injecting<simulated>> b;
  two_taken t(b);
  detail::stitch_block* x = t.x;
  const std::size_t size = t.size;
  const std::uintptr_t pointer = t.pointer;
  b.backend.reset_counts();
  b.backend.fail_at(gmlake::backend::fault::map, 1);  // the replacement's map
  CHECK(b.pool.repair(size, size, 0, 8, 512, 4) == nullptr);
  CHECK(x->cached);
  CHECK(!x->in_use);
  CHECK(x->pointer == pointer - 2 * S);  // moved before the replacement, and kept
  CHECK(x->pieces[0].addr == b.base);
  CHECK(x->pieces[1].addr == b.base + 2 * K);  // its own chunk back in place
  CHECK(b.pool.find(x->pointer) == x);
  CHECK(b.sound());
  b.backend.disarm();
  REQUIRE(b.pool.repair(size, size, 0, 8, 512, 4) == x);
  CHECK(x->pointer == pointer - 2 * S);
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  t.give_back();
  CHECK(b.sound());
}

TEST_CASE("stitch pool: append maps chunks after a cached block, in its reservation's room, then claims") {
  bench b;
  const detail::stitch_piece pieces[] = {{b.base + K, K}, {b.base + 3 * K, K}};
  detail::stitch_block* x = b.pool.build(pieces, 1);
  REQUIRE(x != nullptr);
  CHECK(x->mapped == 2 * K);
  CHECK(x->reserved == 4 * K);
  REQUIRE(b.pool.claim(*x, 2 * K, 2 * K, 0));
  b.pool.release(*x, b.streams.on_free(0));
  CHECK(b.pool.reuse(3 * K, 3 * K, 0, 8) == nullptr);  // too small as it is
  CHECK(b.pool.appendable(4 * K + S, 0, 8, 512, S) == nullptr);  // more than its room
  REQUIRE(b.pool.appendable(3 * K, 0, 8, 512, S) == x);
  const auto reserves = calls(b, call::reserve), maps = calls(b, call::map), access = calls(b, call::set_access);
  const std::uintptr_t pointer = x->pointer;
  const detail::stitch_piece more[] = {{b.base + 5 * K, K}};
  REQUIRE(b.pool.append(*x, more));
  CHECK(calls(b, call::reserve) == reserves);  // no new reservation
  CHECK(calls(b, call::map) == maps + 1);      // only the appended chunk
  CHECK(calls(b, call::set_access) == access + 1);
  CHECK(x->pointer == pointer);
  CHECK(x->mapped == 3 * K);
  CHECK(x->capacity == 3 * K);
  CHECK(x->cached);
  CHECK(b.pool.cached_bytes() == 3 * K);
  CHECK(b.held.mapped.current == static_cast<std::int64_t>(8 * K + 3 * K));
  CHECK(b.large.slot_of(b.base + 5 * K).stitch_refs == 1);
  CHECK(b.sound());
  CHECK(b.pool.reuse(3 * K, 3 * K, 0, 8) == x);
  CHECK(b.sound());
  b.pool.release(*x, b.streams.on_free(0));
  // The room left is one chunk: two do not fit, and nothing is called.
  const detail::stitch_piece two_more[] = {{b.base + 6 * K, K}, {b.base + 7 * K, K}};
  const auto maps2 = calls(b, call::map);
  CHECK(!b.pool.append(*x, two_more));
  CHECK(calls(b, call::map) == maps2);
  CHECK(x->capacity == 3 * K);
  CHECK(x->cached);
  CHECK(b.sound());
}

TEST_CASE("stitch pool: appendable: no room, a used chunk under it, or its last chunk's rest used") {
  bench b;
  SUBCASE("built with no room") {
    detail::stitch_block* x = b.two(1, 3);  // room 0
    REQUIRE(x != nullptr);
    REQUIRE(b.pool.claim(*x, 2 * K, 2 * K, 0));
    b.pool.release(*x, b.streams.on_free(0));
    CHECK(x->reserved == x->mapped);
    CHECK(b.pool.appendable(2 * K + S, 0, 8, 512, S) == nullptr);
  }
  SUBCASE("the last piece takes the free rest of its chunk, with no call; not a used rest") {
    const detail::stitch_piece pieces[] = {{b.base + K, K}, {b.base + 3 * K, S}};  // one slot of chunk 3
    detail::stitch_block* x = b.pool.build(pieces, 1);
    REQUIRE(x != nullptr);
    REQUIRE(b.pool.claim(*x, K + S, K + S, 0));
    b.pool.release(*x, b.streams.on_free(0));
    const auto all = all_calls(b);
    REQUIRE(b.pool.appendable(2 * K, 0, 8, 512, S) == x);
    CHECK(all_calls(b) == all);
    CHECK(x->capacity == 2 * K);
    CHECK(x->pieces.back().size == K);
    CHECK(b.sound());
    REQUIRE(b.pool.claim(*x, 2 * K, 2 * K, 0));
    b.pool.release(*x, b.streams.on_free(0));
    // Another block whose last chunk's rest is in use: not appendable.
    const detail::stitch_piece p2[] = {{b.base + 5 * K, K}, {b.base + 6 * K, S}};
    detail::stitch_block* y = b.pool.build(p2, 1);
    REQUIRE(y != nullptr);
    REQUIRE(b.pool.claim(*y, K + S, K + S, 0));
    b.pool.release(*y, b.streams.on_free(0));
    REQUIRE(b.nodes.reserve(2));
    detail::range& u = b.large.carve(b.large.holding(b.base + 6 * K + 2 * S), b.base + 6 * K + 2 * S, S);
    CHECK(b.pool.appendable(K + 2 * S, 0, 8, 512, S) == nullptr);  // y is passed over (x holds that already)
    CHECK(y->capacity == K + S);
    b.large.release(u, b.streams.on_free(0));
    CHECK(b.sound());
  }
  SUBCASE("not when the rest of its last chunk is a separate free range (freed on another stream)") {
    b.backend.parent().set_auto_complete(false);
    std::uint32_t other = 0;
    REQUIRE(b.streams.index_of(gmlake::host_stream{1}, other));
    const detail::stitch_piece pieces[] = {{b.base + K, K}, {b.base + 3 * K, S}};
    detail::stitch_block* x = b.pool.build(pieces, 1);
    REQUIRE(x != nullptr);
    REQUIRE(b.pool.claim(*x, K + S, K + S, 0));
    REQUIRE(b.nodes.reserve(2));
    detail::range& u = b.large.carve(b.large.holding(b.base + 3 * K + S), b.base + 3 * K + S, K - S);
    const auto t1 = b.streams.on_free(other);
    b.large.release(u, t1);
    b.pool.release(*x, b.streams.on_free(0));  // both pending, on two streams: two free ranges in chunk 3
    CHECK(&b.large.holding(b.base + 3 * K) != &b.large.holding(b.base + 3 * K + S));
    CHECK(!b.streams.usable(t1, 0));  // records an event on stream 1
    b.backend.parent().complete(gmlake::host_stream{1});
    CHECK(b.streams.usable(t1, 0));  // the rest is usable now, but still a range of its own
    CHECK(b.pool.appendable(2 * K, 0, 8, 512, S) == nullptr);
    CHECK(x->capacity == K + S);
    CHECK(b.sound());
    b.backend.parent().complete_all();
  }
  SUBCASE("a chunk under it taken since") {
    detail::stitch_block* x = b.pool.build(std::array{detail::stitch_piece{b.base + K, K}}, 1);
    REQUIRE(x != nullptr);
    REQUIRE(b.pool.claim(*x, K, K, 0));
    b.pool.release(*x, b.streams.on_free(0));
    REQUIRE(b.nodes.reserve(2));
    detail::range& u = b.large.carve(b.large.holding(b.base + K), b.base + K, S);
    CHECK(b.pool.appendable(2 * K, 0, 8, 512, S) == nullptr);
    b.large.release(u, b.streams.on_free(0));
    CHECK(b.pool.appendable(2 * K, 0, 8, 512, S) == x);
    CHECK(b.sound());
  }
}
