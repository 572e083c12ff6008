// gmlake/policy/fit.hpp - FitStrategy models: how a request picks a free range.
//
// All models walk a free_view (the free ranges of at least the request's size,
// smallest first, then lowest address) and return the chosen range unchanged, or
// free_range{} for none. `usable` on a range carries the allocator's stream rules;
// a model skips ranges that are not usable. Their pick is a template over the view,
// so the arena can hand them its own walk, which inlines (concepts.hpp).
#pragma once

#include <cstddef>

#include "../concepts.hpp"

namespace gmlake::policy {

/// Best fit: the smallest usable range, lowest address first among equal sizes.
/// Looks at most `max_scan` ranges past the first (ranges another stream still
/// uses), then gives up.
struct best_fit {
  std::size_t max_scan = 64;

  template <class View>
  free_range pick(View& ranges) const noexcept {
    free_range r;
    for (std::size_t n = 0; n <= max_scan && ranges.next(r); ++n)
      if (r.usable) return r;
    return {};
  }
};
static_assert(FitStrategy<best_fit>);

/// Low-address fit: among the first `window` usable ranges (smallest first), the
/// one at the lowest address. Packs live blocks towards the bottom of an arena, so
/// free memory gathers at the top in large ranges that later requests (and
/// release_cached) can use whole.
struct low_address_fit {
  std::size_t window = 8;
  std::size_t max_scan = 64;

  template <class View>
  free_range pick(View& ranges) const noexcept {
    free_range best, r;
    std::size_t taken = 0;
    for (std::size_t n = 0; n <= max_scan && taken < window && ranges.next(r); ++n) {
      if (!r.usable) continue;
      ++taken;
      if (best.key == nullptr || r.addr < best.addr) best = r;
    }
    return best;
  }
};
static_assert(FitStrategy<low_address_fit>);

} // namespace gmlake::policy
