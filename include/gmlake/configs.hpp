// gmlake/configs.hpp - the named configurations every figure refers to.
//
//  gmlake      stitching with best-fitting pieces, S4 shortfall only, LRU cache (default)
//  bfc         stitching off, each new segment created whole: a plain best-fit
//              caching allocator with coalescing (the baseline)
//  expandable  stitching off, growth extends a free range (PyTorch expandable segments)
//  gmlake_paper stitching as the public GMLake code: largest pieces first, only
//              requests >= 512 MiB, no shortfall path
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
using gmlake_paper_allocator = basic_allocator<B, policy::largest_first, policy::lru, policy::best_fit>;

/// The paper's defaults for the largest_first policy.
inline constexpr policy::largest_first gmlake_paper_stitch{std::size_t{512} << 20, 1u << 16, false};

/// The default allocator type for a backend.
template <PhysicalBackend B>
using allocator = gmlake_allocator<B>;

} // namespace gmlake
