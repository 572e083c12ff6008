// tests/test_stitch_planner.cpp - detail::stitch_planner on its own: free ranges
// offered by hand, chunks of a fixed size, no arena and no backend.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "gmlake/detail/stitch_planner.hpp"
#include "gmlake/policy/stitch.hpp"

namespace {

using gmlake::detail::chunk_ends;
using gmlake::detail::stitch_planner;
using gmlake::detail::stitch_source;
namespace policy = gmlake::policy;

constexpr std::size_t S = 64 * 1024;  // the slot
constexpr std::size_t K = 4 * S;      // every chunk here is 4 slots
constexpr std::uintptr_t base = 0x100000000;

chunk_ends ends_of_k() {
  return chunk_ends(nullptr, [](const void*, std::uintptr_t p) noexcept -> std::uintptr_t {
    return base + ((p - base) / K + 1) * K;
  });
}

/// A free range [addr, addr + size) as the arena would offer it.
stitch_source source(std::uintptr_t addr, std::size_t size) {
  const std::uintptr_t lo = base + (addr - base + K - 1) / K * K, hi = base + (addr + size - base) / K * K;
  if (hi <= lo) {
    const std::uintptr_t boundary = (addr - base) % K == 0 ? addr : lo;
    return {addr, size, size, 0, 0, boundary};
  }
  return {addr, size, lo - addr, hi - lo, addr + size - hi, 0};
}

/// A policy that asks for more pieces than it allows.
struct greedy {
  bool stitches(std::size_t) const noexcept { return true; }
  std::size_t max_pieces() const noexcept { return 1; }
  std::size_t select(std::span<gmlake::stitch_candidate> c, std::size_t) const noexcept { return c.size(); }
  std::size_t edge_min() const noexcept { return 0; }
  bool create_shortfall() const noexcept { return true; }
  gmlake::growth_plan growth(const gmlake::growth_view&) const noexcept { return {}; }
  gmlake::lending lends() const noexcept { return {}; }
};
static_assert(gmlake::StitchPolicy<greedy>);

} // namespace

TEST_CASE("stitch planner: whole chunks of two free ranges cover the request (S3)") {
  stitch_planner p(S, 0, ends_of_k());
  p.offer(source(base, 2 * K));            // chunks 0-1
  p.offer(source(base + 4 * K, K));        // chunk 4
  REQUIRE(p.plan(policy::best_fit_pieces{}, 3 * K, false));
  CHECK(p.fresh() == 0);
  std::size_t bytes = 0;
  for (const auto& x : p.pieces()) bytes += x.size;
  CHECK(bytes == 3 * K);
  CHECK(p.pieces().size() == 2);
}

TEST_CASE("stitch planner: the last piece maps only the chunks the request needs") {
  stitch_planner p(S, 0, ends_of_k());
  p.offer(source(base, 4 * K));
  p.offer(source(base + 8 * K, 4 * K));
  REQUIRE(p.plan(policy::largest_first{}, 5 * K + S, false));
  REQUIRE(p.pieces().size() == 2);
  CHECK(p.pieces()[0].size == 4 * K);
  CHECK(p.pieces()[1].size == 2 * K);  // 1 chunk + 1 slot asked: 2 whole chunks
}

TEST_CASE("stitch planner: short pieces plan new bytes only with a shortfall") {
  stitch_planner p(S, 0, ends_of_k());
  p.offer(source(base, K));
  p.offer(source(base + 2 * K, K));
  CHECK(!p.plan(policy::best_fit_pieces{}, 3 * K, false));
  REQUIRE(p.plan(policy::best_fit_pieces{}, 3 * K, true));
  CHECK(p.fresh() == K);
  const auto pieces = p.add_fresh(base + 10 * K);
  REQUIRE(pieces.size() == 3);
  CHECK(pieces.back().addr == base + 10 * K);
  CHECK(pieces.back().size == K);
}

TEST_CASE("stitch planner: nothing offered, nothing planned") {
  stitch_planner p(S, 0, ends_of_k());
  CHECK(!p.plan(policy::best_fit_pieces{}, K, true));
  CHECK(p.pieces().empty());
}

TEST_CASE("stitch planner: more pieces than max_pieces() are not stitched") {
  stitch_planner p(S, 0, ends_of_k());
  p.offer(source(base, K));
  p.offer(source(base + 2 * K, K));
  CHECK(!p.plan(greedy{}, 2 * K, false));
}

TEST_CASE("stitch planner: offers stop at max_candidates") {
  stitch_planner p(S, 0, ends_of_k());
  std::size_t n = 0;
  while (!p.full()) p.offer(source(base + 2 * K * n++, K));
  CHECK(n == stitch_planner::max_candidates);
}

TEST_CASE("stitch planner: an edge closes a stitch that would otherwise need a new chunk") {
  // A range of 2.5 slots that starts at a chunk boundary and holds no whole chunk:
  // its bytes can close a stitch.
  const stitch_source edge = source(base + 8 * K, 2 * S + S / 2);
  CHECK(edge.whole == 0);
  CHECK(edge.boundary == base + 8 * K);
  for (const std::size_t edge_min : {std::size_t{0}, std::size_t{512}}) {
    CAPTURE(edge_min);
    stitch_planner p(S, edge_min, ends_of_k());
    p.offer(source(base, K));
    p.offer(edge);
    const bool planned = p.plan(policy::best_fit_pieces{}, K + 2 * S, false);
    if (edge_min == 0) {
      CHECK(!planned);  // no edges: the pieces fall short
    } else {
      REQUIRE(planned);
      CHECK(p.fresh() == 0);
      REQUIRE(p.pieces().size() == 2);
      CHECK(p.pieces()[1].addr == base + 8 * K);
      CHECK(p.pieces()[1].size == 2 * S);
    }
  }
}
