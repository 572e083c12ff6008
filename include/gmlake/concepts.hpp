// gmlake/concepts.hpp - the four policy concepts a gmlake allocator is built from.
//
// What holds for all of them:
//  - every operation is `noexcept`; failure is reported by value (errc, result<T>);
//  - policies see a narrow view (a size, a span of candidates, a summary), never
//    the allocator;
//  - each concept is a conjunction of small parts, documented one by one, and each
//    model in backend/ and policy/ is followed by a static_assert of its concept.
//
// Vocabulary: a *chunk* is a physical handle (granularity bytes or a multiple);
// a *block* is a virtual address range; a *stitched block* is a block onto which
// several chunks that are not adjacent elsewhere are mapped side by side.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "detail/range.hpp"
#include "errors.hpp"

namespace gmlake {

// ---------------------------------------------------------------- PhysicalBackend

/// Sizes: `granularity()` is the chunk size unit (sizes and addresses passed to the
/// backend are multiples of it); `capacity()` bounds the physical bytes it can hold.
template <class B>
concept BackendSizes = requires(const B& b) {
  { b.granularity() } noexcept -> std::same_as<std::size_t>;
  { b.capacity() } noexcept -> std::same_as<std::size_t>;
};

/// Virtual address space: `reserve(n)` gives an inaccessible range of n bytes
/// aligned to the granularity; `address_free(va, n)` gives back a whole reservation
/// (nothing may be mapped in it any more).
template <class B>
concept BackendAddressSpace = requires(B& b, std::uintptr_t va, std::size_t n) {
  { b.reserve(n) } noexcept -> std::same_as<result<std::uintptr_t>>;
  { b.address_free(va, n) } noexcept -> std::same_as<errc>;
};

/// Physical chunks: `create(n)` makes n bytes of physical memory (errc::out_of_memory
/// past capacity); `release(c)` drops the handle; the memory goes when its last
/// mapping is unmapped.
template <class B>
concept BackendChunks = std::regular<typename B::chunk_type> &&
    requires(B& b, typename B::chunk_type c, std::size_t n) {
  { b.create(n) } noexcept -> std::same_as<result<typename B::chunk_type>>;
  { b.release(c) } noexcept -> std::same_as<errc>;
};

/// Mapping: `map(va, n, c)` maps the whole chunk c (n bytes) at va inside a
/// reservation; `set_access(va, n)` makes a fully mapped range readable and
/// writable (once per contiguous range); `unmap(va, n)` undoes maps covering
/// exactly [va, va+n). A chunk may be mapped at several addresses at once.
template <class B>
concept BackendMapping = requires(B& b, std::uintptr_t va, std::size_t n, typename B::chunk_type c) {
  { b.map(va, n, c) } noexcept -> std::same_as<errc>;
  { b.set_access(va, n) } noexcept -> std::same_as<errc>;
  { b.unmap(va, n) } noexcept -> std::same_as<errc>;
};

/// Stream order: `stream_type{}` is the default stream; `record(s)` gives an event
/// that completes when the work queued on s so far has finished; `query(e)` says
/// whether it has; `synchronize(e)` waits for it; `destroy(e)` frees it.
template <class B>
concept BackendStreams = std::equality_comparable<typename B::stream_type> &&
    std::default_initializable<typename B::stream_type> && std::copyable<typename B::event_type> &&
    requires(B& b, typename B::stream_type s, typename B::event_type e) {
  { b.record(s) } noexcept -> std::same_as<result<typename B::event_type>>;
  { b.query(e) } noexcept -> std::same_as<result<bool>>;
  { b.synchronize(e) } noexcept -> std::same_as<errc>;
  { b.destroy(e) } noexcept;
};

/// Where physical memory comes from: the CUDA VMM driver, or a host stand-in.
template <class B>
concept PhysicalBackend =
    BackendSizes<B> && BackendAddressSpace<B> && BackendChunks<B> && BackendMapping<B> && BackendStreams<B>;

/// Optional: `failure()` gives the message of the last failure that was not a lack
/// of memory (a driver error), or nullptr if there was none since `clear_failure()`.
/// The allocator then throws backend_error with it instead of out_of_memory.
template <class B>
concept BackendDiagnostics = requires(B& b, const B& cb) {
  { cb.failure() } noexcept -> std::same_as<const char*>;
  { b.clear_failure() } noexcept;
};

/// Optional flag: a backend whose addresses have no memory behind them (simulated:
/// address arithmetic only) declares `static constexpr bool memory_accessible = false`;
/// a decorator that names its `parent_type` has its parent's flag; any other backend
/// hands out memory that can be read and written (on the host, or on the device).
/// Where memory is touched (the std::pmr shell) only backends that satisfy this
/// are accepted, at compile time.
namespace detail {
template <class B>
consteval bool memory_accessible() {
  if constexpr (requires { { B::memory_accessible } -> std::convertible_to<bool>; })
    return B::memory_accessible;
  else if constexpr (requires { typename B::parent_type; })
    return memory_accessible<typename B::parent_type>();
  else
    return true;
}
} // namespace detail

template <class B>
concept BackendMemoryAccessible = PhysicalBackend<B> && detail::memory_accessible<B>();

// ---------------------------------------------------------------- FitStrategy

/// Picks, from the index of free ranges (ordered by size then address), one range
/// of at least `size` bytes that `usable` accepts, or nullptr. Best fit first:
/// the default model takes the smallest.
template <class F>
concept FitStrategy = requires(const F& f, const detail::free_index& index, std::size_t size,
                               detail::range_filter usable) {
  { f.pick(index, size, usable) } noexcept -> std::same_as<const detail::range*>;
};

// ---------------------------------------------------------------- StitchPolicy

/// One free range offered as a stitch piece. Only whole chunks can be stitched, so
/// a piece is [addr + head, addr + head + whole) in the middle of a stitch; the first
/// piece may also take its `head` bytes before that, the last its `tail` bytes after.
struct stitch_candidate {
  std::uintptr_t addr = 0;
  std::size_t head = 0;   ///< bytes from addr to the first chunk boundary
  std::size_t whole = 0;  ///< bytes of whole chunks (> 0)
  std::size_t tail = 0;   ///< bytes from the last chunk boundary to the end
};

/// When to stitch: `stitches(bytes)` is false for requests that must not be stitched
/// (false for every size turns stitching off).
template <class P>
concept StitchWhen = requires(const P& p, std::size_t bytes) {
  { p.stitches(bytes) } noexcept -> std::same_as<bool>;
};

/// How: `max_pieces()` caps pieces per stitch; `select(c, need)` reorders the
/// candidates so that the first k (the return value, <= max_pieces) are the pieces
/// in stitched order, aiming at `need` bytes; 0 means "do not stitch".
template <class P>
concept StitchHow = requires(const P& p, std::span<stitch_candidate> c, std::size_t need) {
  { p.max_pieces() } noexcept -> std::same_as<std::size_t>;
  { p.select(c, need) } noexcept -> std::same_as<std::size_t>;
};

/// S4: `create_shortfall()` true: when the free pieces are not enough, create only
/// the missing chunks (next to a free range, or stitched to the free pieces);
/// false: create the whole request as a new segment.
template <class P>
concept StitchShortfall = requires(const P& p) {
  { p.create_shortfall() } noexcept -> std::same_as<bool>;
};

template <class P>
concept StitchPolicy = StitchWhen<P> && StitchHow<P> && StitchShortfall<P>;

// ---------------------------------------------------------------- EvictionPolicy

/// What the eviction policy sees of the cache of inactive stitched blocks.
struct stitch_cache_view {
  std::size_t inactive_blocks = 0;  ///< stitched blocks cached, not in use
  std::size_t inactive_bytes = 0;   ///< their mapped bytes
  std::size_t mapped_bytes = 0;     ///< bytes mapped by all stitched blocks
};

/// A cached stitched block, as offered for eviction.
struct stitch_info {
  std::size_t bytes = 0;        ///< mapped bytes
  std::uint64_t last_use = 0;   ///< allocator clock at its last free
};

/// When: `over_capacity(v)` true: release inactive stitched blocks now, one at a
/// time, until it turns false.
template <class E>
concept EvictionWhen = requires(const E& e, stitch_cache_view v) {
  { e.over_capacity(v) } noexcept -> std::same_as<bool>;
};

/// Which: `prefer_oldest(oldest, largest)` true: release the least recently used
/// block, false: the largest.
template <class E>
concept EvictionWhich = requires(const E& e, stitch_info a, stitch_info b) {
  { e.prefer_oldest(a, b) } noexcept -> std::same_as<bool>;
};

template <class E>
concept EvictionPolicy = EvictionWhen<E> && EvictionWhich<E>;

} // namespace gmlake
