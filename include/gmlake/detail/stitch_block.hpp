// gmlake/detail/stitch_block.hpp - a block onto which chunks of the arena are
// mapped side by side: the sBlock of the paper.
//
// A stitched block owns no physical memory: its pieces are ranges of the large
// arena, mapped again here in order. In use, it holds the arena ranges covering
// the prefix the caller asked for; cached (inactive), it holds none, and can be
// used again while its pieces are free, or, by a larger request, with chunks
// appended in the room its reservation leaves past its mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <boost/intrusive/list.hpp>
#include <boost/intrusive/set.hpp>

#include "range.hpp"

namespace gmlake::detail {

struct by_pointer_tag;
struct by_capacity_tag;
struct lru_tag;

/// One piece: arena bytes [addr, addr + size), in stitched order.
struct stitch_piece {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  [[nodiscard]] std::uintptr_t end() const noexcept { return addr + size; }
};

struct stitch_block : bi::set_base_hook<bi::tag<by_pointer_tag>, link_mode>,
                      bi::set_base_hook<bi::tag<by_capacity_tag>, link_mode>,
                      bi::list_base_hook<bi::tag<lru_tag>, link_mode> {
  std::uintptr_t va = 0;        ///< the reservation
  std::size_t mapped = 0;       ///< bytes mapped from va (whole chunks)
  std::size_t reserved = 0;     ///< bytes reserved from va: mapped, then room to append chunks
  std::uintptr_t pointer = 0;   ///< what the caller gets: va + the first piece's offset
  std::size_t capacity = 0;     ///< sum of piece sizes
  std::vector<stitch_piece> pieces;
  std::vector<range*> claimed;  ///< in use: the arena ranges of the prefix, in order
  std::size_t claimed_count = 0;
  std::size_t requested = 0;
  std::size_t active = 0;       ///< bytes in use (512 B multiple)
  bool in_use = false;
  bool cached = false;          ///< in the cache and the LRU list (a quarantined block: in the quarantine list)
  stream_tag tag{};             ///< cached: where it was freed
  /// Quarantined (given up on, its undo failed): bytes from va still mapped (0:
  /// none), and whether the reservation is still to be freed.
  std::size_t pending_unmap = 0;
  bool pending_free = false;
  /// Quarantined after a failed repair: bytes [hole_at, hole_at + hole_bytes) from
  /// va are not mapped (the unmap leaves them out).
  std::size_t hole_at = 0;
  std::size_t hole_bytes = 0;
  std::uint64_t last_use = 0;
};

struct stitch_pointer_key {
  using type = std::uintptr_t;
  type operator()(const stitch_block& b) const noexcept { return b.pointer; }
};
struct stitch_capacity_less {
  bool operator()(const stitch_block& a, const stitch_block& b) const noexcept { return a.capacity < b.capacity; }
  bool operator()(const stitch_block& a, std::size_t b) const noexcept { return a.capacity < b; }
  bool operator()(std::size_t a, const stitch_block& b) const noexcept { return a < b.capacity; }
};

using stitch_by_pointer =
    bi::set<stitch_block, bi::base_hook<bi::set_base_hook<bi::tag<by_pointer_tag>, link_mode>>,
            bi::key_of_value<stitch_pointer_key>, bi::constant_time_size<true>>;
using stitch_cache =
    bi::multiset<stitch_block, bi::base_hook<bi::set_base_hook<bi::tag<by_capacity_tag>, link_mode>>,
                 bi::compare<stitch_capacity_less>, bi::constant_time_size<true>>;
using stitch_lru = bi::list<stitch_block, bi::base_hook<bi::list_base_hook<bi::tag<lru_tag>, link_mode>>,
                            bi::constant_time_size<true>>;

} // namespace gmlake::detail
