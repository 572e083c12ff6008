// gmlake/policy/eviction.hpp - EvictionPolicy models: which cached stitched blocks
// to release, and when.
//
// A cached (inactive) stitched block holds no physical memory of its own: its
// chunks stay with the arena. Releasing it costs an unmap; keeping it lets the
// next request of its size be served with no driver call (the paper's S1 on the
// sPool). The policies bound what is kept.
#pragma once

#include <cstddef>

#include "../concepts.hpp"

namespace gmlake::policy {

/// StitchFree as in the paper: least recently used first, once the cached
/// stitched blocks map more than `capacity_bytes` or number more than `max_blocks`.
struct lru {
  std::size_t capacity_bytes = std::size_t{1} << 40;  // mappings are virtual: generous by default
  std::size_t max_blocks = 4096;

  bool over_capacity(stitch_cache_view v) const noexcept {
    return v.inactive_bytes > capacity_bytes || v.inactive_blocks > max_blocks;
  }
  stitch_info victim(const stitch_cache_entries& e) const noexcept { return e.at(e.by_age, 0); }
};
static_assert(EvictionPolicy<lru>);

/// Largest first over the same limits: frees the most mapped bytes per unmap.
struct evict_largest {
  std::size_t capacity_bytes = std::size_t{1} << 40;
  std::size_t max_blocks = 4096;

  bool over_capacity(stitch_cache_view v) const noexcept {
    return v.inactive_bytes > capacity_bytes || v.inactive_blocks > max_blocks;
  }
  /// The largest; the least recently used instead where it maps as many bytes.
  stitch_info victim(const stitch_cache_entries& e) const noexcept {
    const stitch_info oldest = e.at(e.by_age, 0), largest = e.at(e.by_size, 0);
    return oldest.bytes >= largest.bytes ? oldest : largest;
  }
};
static_assert(EvictionPolicy<evict_largest>);

/// No cache: every stitched block is unmapped as soon as it is freed.
struct no_cache {
  bool over_capacity(stitch_cache_view v) const noexcept { return v.inactive_blocks > 0; }
  stitch_info victim(const stitch_cache_entries& e) const noexcept { return e.at(e.by_age, 0); }
};
static_assert(EvictionPolicy<no_cache>);

} // namespace gmlake::policy
