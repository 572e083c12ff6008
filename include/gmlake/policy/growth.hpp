// gmlake/policy/growth.hpp - how the arenas grow: the rules a StitchPolicy model
// carries for its S4 part (StitchShortfall), and their named presets.
//
// Growth is the S4 state of BestFit: where new chunks go is the stitch policy's
// create_shortfall(); how many bytes, cut into what chunks, and when free chunks
// move between the arenas first, are these rules. They are plain values: a model
// holds one and answers growth() and lends() from it.
#pragma once

#include <algorithm>
#include <cstddef>

#include "../concepts.hpp"

namespace gmlake::policy {

struct growth_rules {
  /// Largest chunk that growth of the large arena creates at once (rounded up to
  /// the slot; 0 or one slot: one slot per chunk). Driver time grows with the number
  /// of chunks, not their bytes; a stitch maps whole chunks.
  std::size_t max_chunk = std::size_t{32} << 20;
  /// A growth creates at least `floor` bytes and at least reserved / floor_divisor
  /// (0: no such term), the surplus staying free for the next stitch or split. The
  /// floor is capped at one chunk of max_chunk and at capacity / floor_cap_divisor
  /// (0: no such cap), so it does nothing on small devices. Both 0: no floor.
  std::size_t floor = 0;
  std::size_t floor_divisor = 0;
  std::size_t floor_cap_divisor = 0;
  /// A growth of at least big_growth bytes (0: never) creates chunks of up to
  /// big_chunk bytes instead of max_chunk: fewer chunks for a very large request.
  std::size_t big_growth = 0;
  std::size_t big_chunk = 0;
  /// Once the job has settled (growth_view::settled), max_chunk and big_chunk are
  /// at least these (0: unchanged). While the layout forms, chunks are cut into many
  /// shapes, and small ones leave the least surplus; growth after that comes from
  /// new shapes, which repeat, and larger chunks cost fewer driver calls.
  std::size_t settled_max_chunk = 0;
  std::size_t settled_big_chunk = 0;
  /// A growth that one request fills (growth_view::request) creates those bytes as
  /// one chunk, however large, once the job has settled or when the growth is big
  /// (big_growth): one create and one map instead of one per max_chunk, and an
  /// access call over one handle instead of several. The request frees the chunk
  /// whole, and a stitch maps a whole free chunk as well as several; a later split
  /// leaves the rest of it partly used, which is why the rule waits for the settled
  /// job's repeating shapes, or for a big growth: while the layout forms, a growth
  /// below big_growth keeps the smaller chunks (docs/design.md, "One chunk for a
  /// request": fragmentation unchanged on every trace measured).
  bool request_chunk = false;
  /// The small arena grows by at least its reserved bytes / small_divisor, rounded
  /// down to the slot and capped at small_cap (0: no cap), in chunks of that size
  /// (small_divisor 0: one slot per chunk, no floor). Small requests make many
  /// growths of a slot or two; growing from its own size makes fewer, and the surplus
  /// is a bounded share of what it holds. The price: one live request keeps a whole
  /// chunk, so larger chunks give back less when the arena empties.
  std::size_t small_divisor = 0;
  std::size_t small_cap = 0;
  /// When free chunks move between the arenas.
  gmlake::lending lends{};

  [[nodiscard]] constexpr growth_plan plan(const growth_view& v) const noexcept {
    growth_plan g;
    if (v.small) {
      if (small_divisor == 0) return g;
      g.floor = round_down(v.arena_reserved / small_divisor, v.slot);
      if (small_cap != 0) g.floor = std::min(g.floor, round_down(small_cap, v.slot));
      g.max_chunk = std::max(g.floor, v.slot);
      return g;
    }
    g.max_chunk = round_up(v.settled ? std::max(max_chunk, settled_max_chunk) : max_chunk, v.slot);
    if (floor != 0 || floor_divisor != 0) {
      std::size_t cap = g.max_chunk;
      if (floor_cap_divisor != 0) cap = std::min(cap, v.capacity / floor_cap_divisor);
      cap = round_down(cap, v.slot);
      std::size_t f = round_up(floor, v.slot);
      if (floor_divisor != 0) f = std::max(f, round_down(v.reserved / floor_divisor, v.slot));
      g.floor = std::min(f, cap);
    }
    if (big_growth != 0) {
      g.big_growth = big_growth;
      g.big_chunk = round_up(v.settled ? std::max(big_chunk, settled_big_chunk) : big_chunk, v.slot);
    }
    if (request_chunk && v.request != 0 && (v.settled || (big_growth != 0 && v.request >= big_growth)))
      g.max_chunk = std::max(g.max_chunk, round_up(v.request, v.slot));
    return g;
  }
};

/// Growth creates what the request needs, in chunks of up to 32 MiB (the small
/// arena: one slot per chunk); before the large arena grows past the peak reserved,
/// the small arena releases its free whole chunks. The rules of every configuration
/// that does not stitch.
inline constexpr growth_rules exact_growth{};

/// As exact_growth, and a growth of the large arena creates at least 16 MiB and at
/// least 1/512 of the reserved bytes (capped at one chunk and at capacity / 1024);
/// a growth of 768 MiB or more creates chunks of up to 256 MiB (once the job has
/// settled: chunks of up to 64 MiB, and 1 GiB for such large growths); a growth that
/// one request fills is one chunk once the job has settled, or when it is 768 MiB or
/// more (request_chunk); the small arena grows by at least 1/8 of its reserved bytes
/// (rounded down to the slot), up to 8 MiB, in one chunk; once settled, instead of
/// growing past the peak, the small arena borrows a free chunk of up to 16 MiB of the
/// large one (lending::borrow_max). Fewer, larger chunks for later stitches to map;
/// the surplus is reused by the next stitch or split. The rules of the stitching
/// configurations (docs/design.md, "Growth").
inline constexpr growth_rules stitch_growth{.max_chunk = std::size_t{32} << 20,
                                            .floor = std::size_t{16} << 20,
                                            .floor_divisor = 512,
                                            .floor_cap_divisor = 1024,
                                            .big_growth = std::size_t{768} << 20,
                                            .big_chunk = std::size_t{256} << 20,
                                            .settled_max_chunk = std::size_t{64} << 20,
                                            .settled_big_chunk = std::size_t{1024} << 20,
                                            .request_chunk = true,
                                            .small_divisor = 8,
                                            .small_cap = std::size_t{8} << 20,
                                            .lends = lending{.borrow_max = std::size_t{16} << 20}};

} // namespace gmlake::policy
