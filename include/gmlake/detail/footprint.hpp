// gmlake/detail/footprint.hpp - what the arenas and the stitched blocks hold.
//
// The parts that hold memory keep these gauges as they change it (the arenas
// their chunks, the stitch pool its mappings); the allocator copies them into its
// statistics snapshot. Sums over parts: a peak is the peak of the whole footprint.
#pragma once

#include <cstdint>

#include "../errors.hpp"
#include "../stats.hpp"

namespace gmlake::detail {

struct footprint {
  stat reserved;  ///< physical bytes of the chunks the arenas hold
  stat mapped;    ///< virtual bytes mapped: the arenas' chunks plus the stitched blocks
  stat chunks;    ///< chunks (physical handles) the arenas hold
  stat stitched;  ///< stitched blocks mapped (in use or cached)
  /// Chunk bytes whose undo (unmap, release) failed: the backend may still hold them;
  /// kept in quarantined ranges of the arenas until a retry succeeds.
  stat quarantined;
  /// Stitched blocks given up on whose unmap or address free failed: kept, retried.
  stat quarantined_stitches;
  std::uint64_t failed_cleanups = 0;  ///< unmap / release / address_free calls that failed, kept to retry
};

/// Cleanup calls retried this many times in a row where nothing can retry them
/// later (the destructor).
inline constexpr int close_attempts = 8;

/// Calls f() until it returns errc::ok, at most `n` times; its last result.
template <class F>
errc retry(F&& f, int n = close_attempts) noexcept {
  errc e = errc::ok;
  for (int i = 0; i < n; ++i)
    if ((e = f()) == errc::ok) break;
  return e;
}

} // namespace gmlake::detail
