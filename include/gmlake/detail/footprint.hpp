// gmlake/detail/footprint.hpp - what the arenas and the stitched blocks hold.
//
// The parts that hold memory keep these gauges as they change it (the arenas
// their chunks, the stitch pool its mappings); the allocator copies them into its
// statistics snapshot. Sums over parts: a peak is the peak of the whole footprint.
#pragma once

#include "../stats.hpp"

namespace gmlake::detail {

struct footprint {
  stat reserved;  ///< physical bytes of the chunks the arenas hold
  stat mapped;    ///< virtual bytes mapped: the arenas' chunks plus the stitched blocks
  stat chunks;    ///< chunks (physical handles) the arenas hold
  stat stitched;  ///< stitched blocks mapped (in use or cached)
};

} // namespace gmlake::detail
