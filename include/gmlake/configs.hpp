// gmlake/configs.hpp - the named configurations every figure refers to.
//
//  gmlake      stitching with best-fitting pieces and 4 MiB stitch edges, S4 shortfall
//              only, LRU cache (default)
//  bfc         stitching off, each new segment created whole: a plain best-fit
//              caching allocator with coalescing (the baseline)
//  expandable  stitching off, growth extends a free range (PyTorch expandable segments)
//  gmlake_paper stitching as the public GMLake code: largest pieces first, only
//              requests >= 512 MiB, no shortfall path (policy::gmlake_paper)
//
// Growth: the stitching configurations grow with policy::stitch_growth (a floor of
// new bytes per growth, big chunks for big growths, a small arena that grows from
// its own size), the others with policy::exact_growth (policy/growth.hpp). Both
// lend the small arena's free chunks to the large one before it grows past the peak.
#pragma once

#include "allocator.hpp"

namespace gmlake {

template <PhysicalBackend B>
using gmlake_allocator = basic_allocator<B, policy::best_fit_pieces, policy::lru, policy::best_fit>;
template <PhysicalBackend B>
using bfc_allocator = basic_allocator<B, policy::no_stitch, policy::lru, policy::best_fit>;
template <PhysicalBackend B>
using expandable_allocator = basic_allocator<B, policy::expand_only, policy::lru, policy::best_fit>;
template <PhysicalBackend B>
using gmlake_paper_allocator = basic_allocator<B, policy::gmlake_paper, policy::lru, policy::best_fit>;

/// The default allocator type for a backend.
template <PhysicalBackend B>
using allocator = gmlake_allocator<B>;

} // namespace gmlake
