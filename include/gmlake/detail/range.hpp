// gmlake/detail/range.hpp - the node every byte of an arena's address space lives in.
//
// An arena's virtual range is tiled by `range` nodes in address order. A range is
// a hole (no physical chunk behind it), free, or used. Free ranges also sit in the
// free index (ordered by size, then address) that a FitStrategy searches through
// a free_view; holes sit
// in the hole index. Nodes carry their hooks, so indexing a range never allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include <boost/intrusive/set.hpp>

#include "config.hpp"

namespace gmlake::detail {

namespace bi = boost::intrusive;

#if GMLAKE_DEBUG >= 2
using link_mode = bi::link_mode<bi::safe_link>;
#else
using link_mode = bi::link_mode<bi::normal_link>;
#endif

struct by_address_tag;
struct by_size_tag;

/// quarantined: address space whose chunks the backend may still map or hold after
/// an undo (unmap, release) failed; in no index but the address one, never handed
/// out, turned back into a hole once the undo is retried with success.
/// lent: one whole chunk that the other arena maps and uses as well; in no index
/// but the address one, free again once that arena gives it back.
enum class range_state : unsigned char { hole, free, used, quarantined, lent };

/// Stream tag of a free range: it was freed on stream `stream` (an index into the
/// allocator's stream table) after that stream's `seq`-th free. seq 0: no pending work.
struct stream_tag {
  std::uint32_t stream = 0;
  std::uint64_t seq = 0;
};

struct stitch_block;

struct range : bi::set_base_hook<bi::tag<by_address_tag>, link_mode>,
               bi::set_base_hook<bi::tag<by_size_tag>, link_mode> {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  range_state state = range_state::hole;
  std::uint32_t segment = 0;     ///< ranges coalesce only within one segment
  stream_tag tag{};              ///< free: on which stream it was freed
  std::size_t requested = 0;     ///< used: bytes the caller asked for
  stitch_block* owner = nullptr; ///< used: the stitched block this range is a piece of

  [[nodiscard]] std::uintptr_t end() const noexcept { return addr + size; }
  [[nodiscard]] bool is_free() const noexcept { return state == range_state::free; }
};

struct range_address_key {
  using type = std::uintptr_t;
  type operator()(const range& r) const noexcept { return r.addr; }
};

/// Orders by size, then by address, so best fit is one lower_bound and ties go low.
struct range_size_less {
  bool operator()(const range& a, const range& b) const noexcept {
    return a.size != b.size ? a.size < b.size : a.addr < b.addr;
  }
};

using address_index =
    bi::set<range, bi::base_hook<bi::set_base_hook<bi::tag<by_address_tag>, link_mode>>,
            bi::key_of_value<range_address_key>, bi::constant_time_size<true>>;

using free_index =
    bi::multiset<range, bi::base_hook<bi::set_base_hook<bi::tag<by_size_tag>, link_mode>>,
                 bi::compare<range_size_less>, bi::constant_time_size<true>>;

/// Heterogeneous key for lower_bound on a free_index: the smallest range of `size`.
struct size_key {
  std::size_t size;
};
struct size_key_less {
  bool operator()(const range& r, size_key k) const noexcept { return r.size < k.size; }
  bool operator()(size_key k, const range& r) const noexcept { return k.size < r.size; }
};

} // namespace gmlake::detail
