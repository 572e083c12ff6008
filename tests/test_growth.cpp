// tests/test_growth.cpp - the growth rules (policy/growth.hpp) and how an arena
// carries out a growth_plan: chunk sizes, the floor, big chunks, the footprint.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>

#include "gmlake/backend/counting.hpp"
#include "gmlake/backend/simulated.hpp"
#include "gmlake/detail/arena.hpp"
#include "gmlake/detail/settling.hpp"
#include "gmlake/policy/growth.hpp"
#include "gmlake/policy/stitch.hpp"

namespace {

using gmlake::call;
using gmlake::growth_plan;
using gmlake::growth_view;
using gmlake::backend::counting;
using gmlake::backend::simulated;
namespace policy = gmlake::policy;
namespace detail = gmlake::detail;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t S = 2 * mib;

} // namespace

TEST_CASE("growth rules: exact growth has no floor and 32 MiB chunks") {
  const growth_plan g = policy::exact_growth.plan(growth_view{S, 10 * 1024 * mib, 80 * 1024 * mib});
  CHECK(g.floor == 0);
  CHECK(g.max_chunk == 32 * mib);
  CHECK(g.big_growth == 0);
  CHECK(policy::exact_growth.lends.to_large);
  CHECK(!policy::exact_growth.lends.to_small);
}

TEST_CASE("growth rules: the stitch preset's floor follows the footprint, capped by one chunk and the capacity") {
  const auto& r = policy::stitch_growth;
  // A large device: the floor is max(16 MiB, reserved / 512), at most one 32 MiB chunk.
  CHECK(r.plan({S, 0, 80 * 1024 * mib}).floor == 16 * mib);
  CHECK(r.plan({S, 12 * 1024 * mib, 80 * 1024 * mib}).floor == 24 * mib);
  CHECK(r.plan({S, 40 * 1024 * mib, 80 * 1024 * mib}).floor == 32 * mib);
  // A small device: capacity / 1024 caps it (here below one slot: no floor).
  CHECK(r.plan({S, 0, 1024 * mib}).floor == 0);
  const growth_plan g = r.plan({S, 0, 80 * 1024 * mib});
  CHECK(g.big_growth == 768 * mib);
  CHECK(g.big_chunk == 256 * mib);
}

TEST_CASE("growth rules: the small arena grows from its own size in the stitch preset, by a slot in the exact one") {
  const std::size_t cap = 80 * 1024 * mib;
  const auto small = [&](const policy::growth_rules& r, std::size_t arena_reserved) {
    return r.plan(growth_view{S, 40 * 1024 * mib, cap, true, arena_reserved});
  };
  // stitch_growth: at least 1/8 of the small arena's bytes, at most 8 MiB, one chunk.
  CHECK(small(policy::stitch_growth, 0).floor == 0);
  CHECK(small(policy::stitch_growth, 8 * S).floor == S);
  CHECK(small(policy::stitch_growth, 16 * mib).max_chunk == S);
  CHECK(small(policy::stitch_growth, 40 * mib).floor == 4 * mib);  // 5 MiB, rounded down to the slot
  CHECK(small(policy::stitch_growth, 40 * mib).max_chunk == 4 * mib);
  CHECK(small(policy::stitch_growth, 1024 * mib).floor == 8 * mib);
  CHECK(small(policy::stitch_growth, 1024 * mib).max_chunk == 8 * mib);
  // The large arena's floor and big chunks do not apply to the small one.
  CHECK(small(policy::stitch_growth, 1024 * mib).big_growth == 0);
  // exact_growth (no stitching): one slot per chunk, no floor, whatever its size.
  CHECK(small(policy::exact_growth, 1024 * mib).floor == 0);
  CHECK(small(policy::exact_growth, 1024 * mib).max_chunk == 0);
  // The large arena's plan does not read arena_reserved: 20 GiB / 512 would be 40 MiB
  // (capped at 32 MiB); from reserved 0 it is the 16 MiB floor.
  CHECK(policy::stitch_growth.plan(growth_view{S, 0, cap, false, 20 * 1024 * mib}).floor == 16 * mib);
}

TEST_CASE("growth rules: the small arena's cap binds below the divisor's floor; 0 is no cap") {
  policy::growth_rules r;
  r.small_divisor = 2;
  const auto floor = [&](std::size_t arena_reserved) {
    return r.plan(growth_view{S, 0, 80 * 1024 * mib, true, arena_reserved}).floor;
  };
  r.small_cap = 6 * mib;
  CHECK(floor(8 * mib) == 4 * mib);    // 8 / 2, under the cap
  CHECK(floor(64 * mib) == 6 * mib);   // the cap
  r.small_cap = 5 * mib;
  CHECK(floor(64 * mib) == 4 * mib);   // a cap between slots rounds down
  r.small_cap = mib;
  CHECK(floor(64 * mib) == 0);         // a cap below one slot: one slot per chunk
  CHECK(r.plan(growth_view{S, 0, 80 * 1024 * mib, true, 64 * mib}).max_chunk == S);
  r.small_cap = 0;
  CHECK(floor(64 * mib) == 32 * mib);  // no cap
  CHECK(floor(3 * mib) == 0);          // 1.5 MiB rounds down to no floor
}

TEST_CASE("growth rules: sizes round to the slot") {
  policy::growth_rules r;
  r.max_chunk = 3 * mib;
  r.floor = 5 * mib;
  CHECK(r.plan({S, 0, 1024 * 1024 * mib}).max_chunk == 4 * mib);
  CHECK(r.plan({S, 0, 1024 * 1024 * mib}).floor == 4 * mib);  // capped at one chunk
  r.max_chunk = 0;
  CHECK(r.plan({S, 0, 1024 * mib}).max_chunk == 0);  // one slot per chunk
}

TEST_CASE("growth rules: each stitch policy carries its own") {
  CHECK(policy::no_stitch{}.growth({S, 0, 80 * 1024 * mib}).floor == 0);
  CHECK(policy::expand_only{}.growth({S, 0, 80 * 1024 * mib}).floor == 0);
  CHECK(policy::gmlake_paper{}.growth({S, 0, 80 * 1024 * mib}).floor == 0);
  CHECK(!policy::gmlake_paper{}.create_shortfall());
  CHECK(policy::gmlake_paper{}.stitches(512 * mib));
  CHECK(!policy::gmlake_paper{}.stitches(511 * mib));
  CHECK(policy::best_fit_pieces{}.growth({S, 0, 80 * 1024 * mib}).floor == 16 * mib);
  CHECK(policy::largest_first{}.growth({S, 0, 80 * 1024 * mib}).floor == 16 * mib);
}

TEST_CASE("growth rules: once settled, the stitch preset grows in 64 MiB chunks and 1 GiB big chunks") {
  const auto& r = policy::stitch_growth;
  growth_view v{S, 40 * 1024 * mib, 80 * 1024 * mib};
  v.settled = true;
  const growth_plan g = r.plan(v);
  CHECK(g.max_chunk == 64 * mib);
  CHECK(g.floor == 64 * mib);  // reserved / 512 = 80 MiB, capped at one chunk
  CHECK(g.big_growth == 768 * mib);
  CHECK(g.big_chunk == 1024 * mib);
  v.settled = false;
  CHECK(r.plan(v).max_chunk == 32 * mib);
  CHECK(r.plan(v).big_chunk == 256 * mib);
  // The exact preset has no settled sizes: settling changes nothing.
  v.settled = true;
  CHECK(policy::exact_growth.plan(v).max_chunk == 32 * mib);
  CHECK(policy::exact_growth.plan(v).big_growth == 0);
  // Settled sizes are a lower bound: larger chunks set by the user stay.
  policy::growth_rules big = r;
  big.max_chunk = 128 * mib;
  big.big_chunk = 2048 * mib;
  CHECK(big.plan(v).max_chunk == 128 * mib);
  CHECK(big.plan(v).big_chunk == 2048 * mib);
  // The small arena's growth does not follow.
  v.small = true;
  v.arena_reserved = 64 * mib;
  CHECK(r.plan(v).max_chunk == 8 * mib);
}

TEST_CASE("growth rules: a growth that one request fills is one chunk once settled, or when big") {
  const auto& r = policy::stitch_growth;
  CHECK(r.request_chunk);
  growth_view v{S, 40 * 1024 * mib, 80 * 1024 * mib};
  // While the layout forms: a request below big_growth keeps the 32 MiB chunks ...
  v.request = 300 * mib;
  CHECK(r.plan(v).max_chunk == 32 * mib);
  // ... and one of big_growth or more is one chunk (rounded up to the slot).
  v.request = 800 * mib + 1;
  CHECK(r.plan(v).max_chunk == 802 * mib);
  v.request = 768 * mib;  // big_growth itself is big
  CHECK(r.plan(v).max_chunk == 768 * mib);
  policy::growth_rules no_big = r;  // no big growths: only once settled
  no_big.big_growth = 0;
  v.request = 800 * mib;
  CHECK(no_big.plan(v).max_chunk == 32 * mib);
  // Settled: one chunk at any size; below the settled chunk size nothing changes.
  v.settled = true;
  v.request = 300 * mib;
  CHECK(r.plan(v).max_chunk == 300 * mib);
  v.request = 10 * mib;
  CHECK(r.plan(v).max_chunk == 64 * mib);
  CHECK(r.plan(v).floor == 64 * mib);  // the floor is unchanged
  // No request (a stitch's new chunks, shared bytes): the usual chunks.
  v.request = 0;
  CHECK(r.plan(v).max_chunk == 64 * mib);
  // Off, and in the exact preset (the non-stitching configurations): unchanged.
  policy::growth_rules off = r;
  off.request_chunk = false;
  v.request = 300 * mib;
  CHECK(off.plan(v).max_chunk == 64 * mib);
  CHECK(!policy::exact_growth.request_chunk);
  CHECK(policy::exact_growth.plan(v).max_chunk == 32 * mib);
  // The small arena never: its chunks are packed by many requests.
  v.small = true;
  v.arena_reserved = 64 * mib;
  CHECK(r.plan(v).max_chunk == 8 * mib);
}

TEST_CASE("settling: judged each window of requested bytes, from the growth of the reserved bytes") {
  detail::settling s(2, 50);  // a window of 2 x reserved; at most 2% growth
  CHECK(!s.settled());
  s.on_request(150, 100);
  CHECK(!s.settled());  // the window is not over
  s.on_request(50, 100);
  CHECK(!s.settled());  // the first judgement: nothing to compare with yet
  s.on_request(210, 105);
  CHECK(!s.settled());  // grew by 5%
  s.on_request(209, 107);
  CHECK(!s.settled());  // the window is 2 x the reserved bytes now: 214
  s.on_request(5, 107);
  CHECK(s.settled());  // grew by 2 bytes, less than 2%
  s.on_request(1000, 500);
  CHECK(s.settled());  // settled stays: growth after it is the formed layout's
  s.reset();
  CHECK(!s.settled());
  s.on_request(200, 100);
  s.on_request(200, 100);
  CHECK(s.settled());  // no growth at all
  s.reset();
  // Requested bytes saturate instead of wrapping.
  s.on_request(~std::size_t{0}, 100);
  s.on_request(~std::size_t{0}, 100);
  CHECK(s.settled());
}

TEST_CASE("settling: window 0 never settles; nothing reserved never settles") {
  detail::settling off(0, 50);
  for (int i = 0; i < 100; ++i) off.on_request(1000, 100);
  CHECK(!off.settled());
  detail::settling empty(2, 50);
  for (int i = 0; i < 100; ++i) empty.on_request(1000, 0);
  CHECK(!empty.settled());
  detail::settling strict(1, 0);  // divisor 0 counts as 1: up to 100% growth
  strict.on_request(100, 100);
  strict.on_request(200, 200);
  CHECK(strict.settled());
}

namespace {

struct one_arena {
  counting<simulated> backend{std::size_t{1} << 30, S};
  detail::footprint held;
  detail::node_pool<detail::range> nodes;
  detail::stream_table<counting<simulated>> streams{backend};
  detail::arena<counting<simulated>> a{backend, nodes, streams, held, S};
  one_arena() {
    REQUIRE(a.open(std::size_t{1} << 30) == gmlake::errc::ok);
    REQUIRE(nodes.reserve(8));
  }
  ~one_arena() { a.close(); }
  std::uint64_t creates() const { return backend.counts().calls_of(call::create); }
};

} // namespace

TEST_CASE("arena growth: chunks of up to max_chunk, the first ones largest; the footprint follows") {
  one_arena t;
  std::uintptr_t fresh = 0;
  REQUIRE(t.a.grow(10 * S, 0, fresh, growth_plan{0, 4 * S, 0, 0}));
  CHECK(t.creates() == 3);  // 4 + 4 + 2 slots
  CHECK(t.held.chunks.current == 3);
  CHECK(t.held.reserved.current == static_cast<std::int64_t>(10 * S));
  CHECK(t.held.mapped.current == static_cast<std::int64_t>(10 * S));
  CHECK(t.a.chunk_end(fresh) == fresh + 4 * S);
  CHECK(t.a.chunk_end(fresh + 9 * S) == fresh + 10 * S);
  CHECK(t.a.release_free_chunks() == 10 * S);
  CHECK(t.held.chunks.current == 0);
  CHECK(t.held.reserved.current == 0);
}

TEST_CASE("arena growth: the floor creates a surplus where the hole allows; big growths take big chunks") {
  one_arena t;
  std::uintptr_t fresh = 0;
  REQUIRE(t.a.grow(S, 0, fresh, growth_plan{8 * S, 8 * S, 0, 0}));
  CHECK(t.held.reserved.current == static_cast<std::int64_t>(8 * S));
  CHECK(t.creates() == 1);
  REQUIRE(t.a.grow(64 * S, 0, fresh, growth_plan{0, 8 * S, 64 * S, 32 * S}));
  CHECK(t.creates() == 1 + 2);  // two chunks of 32 slots, not eight of 8
  std::size_t reserved = 0, used = 0, live = 0;
  CHECK(t.a.check(reserved, used, live));
  CHECK(reserved == 72 * S);
}

TEST_CASE("arena growth: one map per chunk and one set_access over the whole run") {
  // On the H200 cuMemSetAccess costs about the same per handle whether a call covers
  // one handle or many (bench/results/h200-vmm-call-cost.txt): one call over the run
  // saves the per-call part only, and fewer handles is what saves driver time.
  one_arena t;
  std::uintptr_t fresh = 0;
  REQUIRE(t.a.grow(10 * S, 0, fresh, growth_plan{0, 4 * S, 0, 0}));
  CHECK(t.backend.counts().calls_of(call::create) == 3);
  CHECK(t.backend.counts().calls_of(call::map) == 3);
  CHECK(t.backend.counts().calls_of(call::set_access) == 1);
}

TEST_CASE("arena growth: a plan of one slot per chunk") {
  one_arena t;
  std::uintptr_t fresh = 0;
  REQUIRE(t.a.grow(3 * S, 0, fresh, growth_plan{}));
  CHECK(t.creates() == 3);
  CHECK(t.held.chunks.current == 3);
}
