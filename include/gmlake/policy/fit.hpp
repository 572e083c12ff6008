// gmlake/policy/fit.hpp - FitStrategy models: how a request picks a free range.
//
// All models search the free index (ordered by size, then address) and return the
// chosen range or nullptr; they never modify it. `usable` carries the allocator's
// stream rules; a model skips ranges it rejects.
#pragma once

#include <cstddef>

#include "../concepts.hpp"

namespace gmlake::policy {

/// Best fit: the smallest usable range of at least `size` bytes, lowest address
/// first among equal sizes. Scans at most `max_scan` candidates past the first
/// (ranges another stream still uses), then gives up.
struct best_fit {
  std::size_t max_scan = 64;

  const detail::range* pick(const detail::free_index& index, std::size_t size,
                            detail::range_filter usable) const noexcept {
    auto it = index.lower_bound(detail::size_key{size}, detail::size_key_less{});
    for (std::size_t n = 0; it != index.end() && n <= max_scan; ++it, ++n)
      if (usable(*it)) return &*it;
    return nullptr;
  }
};
static_assert(FitStrategy<best_fit>);

/// Low-address fit: among the first `window` usable ranges of at least `size`
/// bytes (smallest first), the one at the lowest address. Packs live blocks
/// towards the bottom of an arena, so free memory gathers at the top in large
/// ranges that later requests (and release_cached) can use whole.
struct low_address_fit {
  std::size_t window = 8;
  std::size_t max_scan = 64;

  const detail::range* pick(const detail::free_index& index, std::size_t size,
                            detail::range_filter usable) const noexcept {
    const detail::range* best = nullptr;
    std::size_t taken = 0;
    auto it = index.lower_bound(detail::size_key{size}, detail::size_key_less{});
    for (std::size_t n = 0; it != index.end() && n <= max_scan && taken < window; ++it, ++n) {
      if (!usable(*it)) continue;
      ++taken;
      if (best == nullptr || it->addr < best->addr) best = &*it;
    }
    return best;
  }
};
static_assert(FitStrategy<low_address_fit>);

} // namespace gmlake::policy
