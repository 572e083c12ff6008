// gmlake/stats.hpp - allocator statistics, shaped like torch.cuda.memory_stats().
//
// Plain aggregates; a snapshot is copied out under the allocator's lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace gmlake {

/// One gauge: its value now, its high-water mark, and the totals that moved it.
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  ///< sum of increases
  std::int64_t freed = 0;      ///< sum of decreases

  void add(std::int64_t n) noexcept {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void sub(std::int64_t n) noexcept {
    current -= n;
    freed += n;
  }
  void reset_peak() noexcept { peak = current; }
};

/// BestFit outcome of a request (docs/design.md walks one request through them).
enum class fit_state : unsigned char {
  s1_exact = 0,   ///< a free block or cached stitched block of exactly the size
  s2_split,       ///< one larger free block, split
  s3_stitch,      ///< free pieces stitched, no new memory
  s4_shortfall,   ///< new chunks for the shortfall only (next to a free range or stitched)
  s5_oom,         ///< nothing could serve it: out of memory
};
inline constexpr std::size_t fit_state_count = 5;

/// Backend calls by kind. statistics::calls counts one per call (an unmap over
/// several chunks is one call), as backend::counting does, which counts them.
enum class call : unsigned char { reserve = 0, address_free, create, release, map, set_access, unmap, record, count_ };
inline constexpr std::size_t call_count = static_cast<std::size_t>(call::count_);
inline constexpr std::array<const char*, call_count> call_names = {
    "reserve", "address_free", "create", "release", "map", "set_access", "unmap", "record"};

struct statistics {
  stat requested_bytes;   ///< bytes asked for by live allocations
  stat active_bytes;      ///< bytes of live allocations as placed (512 B multiples)
  stat reserved_bytes;    ///< physical bytes held from the backend (chunks)
  stat mapped_bytes;      ///< virtual bytes mapped: arenas plus stitched blocks
  stat chunks;            ///< chunks (physical handles) held
  stat stitched_blocks;   ///< stitched blocks mapped (active or cached)
  stat allocations;       ///< live allocations
  /// Chunk bytes whose undo (unmap or release) failed: the backend may still hold
  /// them; quarantined (never handed out), retried on growth, release_cached() and
  /// in the destructor. Not in reserved_bytes, but for a chunk the small arena
  /// was borrowing whose access call and then the unmap undoing it failed: that chunk
  /// is still the large arena's, so it is in reserved_bytes (once) and here too, until
  /// the unmap is retried and the loan goes back.
  stat quarantined_bytes;
  /// Stitched blocks given up on whose unmap or address free failed: kept, retried
  /// likewise. Not in stitched_blocks.
  stat quarantined_stitches;
  std::array<std::uint64_t, fit_state_count> fit{};  ///< requests by BestFit state
  std::array<std::uint64_t, call_count> calls{};     ///< backend calls by kind, one per call
  std::array<std::uint64_t, call_count> call_failures{};  ///< of those, the ones that failed
  std::uint64_t cached_stitch_hits = 0;  ///< S1 served by a cached stitched block
  std::uint64_t cached_stitch_repairs = 0;  ///< of those, after some of its chunks were replaced
  std::uint64_t cached_stitch_appends = 0;  ///< cached stitched blocks that chunks were appended to
  std::uint64_t evictions = 0;           ///< stitched blocks released by the eviction policy
  std::uint64_t num_alloc_retries = 0;   ///< requests that released cache and retried
  std::uint64_t num_ooms = 0;            ///< requests that failed
  std::uint64_t invalid_frees = 0;       ///< deallocate of a pointer not live here (ignored)
  std::uint64_t lent_bytes = 0;          ///< free chunk bytes released to let the other arena grow
  std::uint64_t borrowed_bytes = 0;      ///< large-arena chunk bytes the small arena borrowed instead of growing
  std::uint64_t failed_cleanups = 0;     ///< unmap, release, address_free calls that failed (kept and retried)
  /// Times the host waited for a stream's work to finish (an event synchronize):
  /// only in release_cached(), before out-of-memory (S5), before a cached stitched
  /// block is unmapped, when host memory to track a new stream ran out (that
  /// stream's work), after an append to a cached stitched block failed and so did
  /// its undo (and before that block is unmapped, if that wait failed), and in the
  /// destructor. Each drains that stream's queue of work.
  std::uint64_t stream_waits = 0;
};

/// One segment of the layout (basic_allocator::visit_layout): a chunk of an arena,
/// or a stitched block's mapping.
struct layout_segment {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  enum kind_type : unsigned char { small_chunk, large_chunk, stitched } kind = large_chunk;
};

/// One piece of a segment: an allocation, arena bytes a stitched block maps, or free.
struct layout_piece {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  enum state_type : unsigned char { free, allocated, mapped_by_stitch } state = free;
};

/// Where the reserved bytes are at one moment (basic_allocator::breakdown()):
/// reserved = small_reserved + large_reserved; each arena's reserved bytes are its
/// used bytes plus its free bytes. Used bytes hold the live requests plus the
/// rounding to 512 B (and alignment) inside them.
struct memory_breakdown {
  std::size_t requested = 0;           ///< bytes asked for by live allocations
  std::size_t active = 0;              ///< bytes of live allocations as placed
  std::size_t small_reserved = 0;      ///< chunk bytes of the small arena
  std::size_t small_free = 0;          ///< free bytes in the small arena
  std::size_t large_reserved = 0;      ///< chunk bytes of the large arena
  std::size_t large_free_whole = 0;    ///< free bytes in whole chunks (stitchable)
  std::size_t large_free_partial = 0;  ///< free bytes in partly used chunks (not stitchable)
  std::size_t free_pending = 0;        ///< free bytes whose stream work is not known done: usable on the
                                       ///< stream that freed them, not yet on others (both arenas)
  std::size_t cached_stitches = 0;     ///< inactive stitched blocks cached
  std::size_t cached_stitch_bytes = 0; ///< their mapped (virtual) bytes
  std::size_t quarantined = 0;         ///< chunk bytes quarantined after a failed undo (not in reserved)
  std::size_t quarantined_stitches = 0;     ///< stitched blocks kept after a failed unmap or address free
  std::size_t quarantined_stitch_bytes = 0; ///< their reserved (virtual) bytes
};

} // namespace gmlake
