// gmlake/concepts.hpp - the four policy concepts a gmlake allocator is built from.
//
// What holds for all of them:
//  - every operation is `noexcept`; failure is reported by value (errc, result<T>);
//  - policies see a narrow view (a size, a span of candidates, a summary), never
//    the allocator;
//  - each concept is a conjunction of small parts, documented one by one, and each
//    model in backend/ and policy/ is followed by a static_assert of its concept.
//
// Vocabulary: a *chunk* is a physical handle (a multiple of the allocator's
// chunk_size(), the smallest chunk); a *block* is a virtual address range; a
// *stitched block* is a block onto which several chunks that are not adjacent
// elsewhere are mapped side by side; a *free range* is free bytes of an arena.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

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

/// A free range as a FitStrategy sees it.
struct free_range {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  bool usable = false;        ///< the request may take it now (the allocator's stream rules)
  const void* key = nullptr;  ///< names the range to the allocator; nullptr: no range
};

/// The free ranges of one arena of at least the requested size, smallest first
/// (lowest address first among equal sizes), one at a time. Each is yielded once;
/// whether it is usable is worked out only when it is yielded (that may query a
/// stream event), so a strategy stops as soon as it has chosen.
class free_view {
 public:
  using next_fn = bool (*)(void* state, free_range& out) noexcept;
  free_view(void* state, next_fn next) noexcept : state_(state), next_(next) {}
  /// The next range into `out`; false when there is none.
  [[nodiscard]] bool next(free_range& out) noexcept { return next_(state_, out); }

 private:
  void* state_;
  next_fn next_;
};

/// Picks one usable range from the view and returns it unchanged, or a default
/// free_range (key nullptr) for none. Best fit first: the default model takes the
/// first usable one, the smallest. A model whose pick is a template over the view
/// (`template <class View> free_range pick(View&) const noexcept`, calling only
/// `next`) is given the arena's own walk of its free ranges instead of a free_view,
/// so that the walk inlines; the ranges and their order are the same.
template <class F>
concept FitStrategy = requires(const F& f, free_view& v) {
  { f.pick(v) } noexcept -> std::same_as<free_range>;
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

/// How: `select(c, need)` reorders the candidates so that the first k (the return
/// value) are the pieces in stitched order, aiming at `need` bytes; 0 means "do not
/// stitch". `max_pieces()` caps k: a larger k is not stitched. `edge_min()`: free
/// bytes at a chunk boundary of a range with no whole chunk may open or close a
/// stitch that would otherwise create new chunks, at least this many (0: never).
template <class P>
concept StitchHow = requires(const P& p, std::span<stitch_candidate> c, std::size_t need) {
  { p.max_pieces() } noexcept -> std::same_as<std::size_t>;
  { p.select(c, need) } noexcept -> std::same_as<std::size_t>;
  { p.edge_min() } noexcept -> std::same_as<std::size_t>;
};

/// What growth of an arena sees.
struct growth_view {
  std::size_t slot = 0;            ///< bytes of the smallest chunk (chunk sizes are multiples)
  std::size_t reserved = 0;        ///< physical bytes the allocator holds now
  std::size_t capacity = 0;        ///< the backend's capacity
  bool small = false;              ///< the small arena grows (else the large one)
  std::size_t arena_reserved = 0;  ///< physical bytes the growing arena holds now
  bool settled = false;            ///< the job has settled: its footprint stopped growing (options::settle_window)
  /// The large arena grows for one request, which will fill the new bytes: their
  /// bytes (0: the new bytes are shared, as a stitch's new chunks or a floor's surplus
  /// past them are, or the small arena grows).
  std::size_t request = 0;
};

/// How one growth of an arena creates chunks.
struct growth_plan {
  std::size_t floor = 0;       ///< create at least this many bytes where the hole allows (the surplus stays free; 0: what is needed)
  std::size_t max_chunk = 0;   ///< largest chunk created (a multiple of the slot; 0 or the slot: one slot per chunk)
  std::size_t big_growth = 0;  ///< a growth of at least this many bytes (0: none) ...
  std::size_t big_chunk = 0;   ///< ... creates chunks of up to this many bytes instead
};

/// When free chunks move between the arenas: before one arena grows past the peak
/// reserved so far, the other releases free chunks, so bytes move instead of adding up.
struct lending {
  bool to_large = true;   ///< the small arena releases its free whole chunks
  bool to_small = false;  ///< the large arena releases one unpinned free chunk
  /// Instead of growing past the peak, the small arena borrows a free whole chunk of
  /// the large arena of at most this many bytes (0: never), once the job has settled
  /// and while its live bytes are below 4/5 of their peak, of the chunks no stitched
  /// block maps: mapped there as well, no new physical memory; given back once free
  /// again, before the large arena grows. (policy::stitch_growth: 16 MiB.)
  std::size_t borrow_max = 0;
};

/// S4, where new memory comes from: `create_shortfall()` true: when the free pieces
/// are not enough, create only the missing chunks (next to a free range, or stitched
/// to the free pieces); false: create the whole request as a new segment.
/// `growth(v)`: how many bytes and in what chunks an arena grows, asked for both
/// arenas (`v.small`: the small one; `growth_plan{}` grows it one slot per chunk);
/// `lends()`: when free chunks move between the arenas.
template <class P>
concept StitchShortfall = requires(const P& p, growth_view v) {
  { p.create_shortfall() } noexcept -> std::same_as<bool>;
  { p.growth(v) } noexcept -> std::same_as<growth_plan>;
  { p.lends() } noexcept -> std::same_as<lending>;
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
  std::uintptr_t pointer = 0;   ///< its address: names it to the allocator
};

/// The cached stitched blocks, in two orders: `at(by_age, i)` is the i-th least
/// recently used, `at(by_size, i)` the i-th largest (by capacity). i < size().
class stitch_cache_entries {
 public:
  enum order : unsigned char { by_age, by_size };
  using at_fn = stitch_info (*)(const void* state, order o, std::size_t i) noexcept;
  stitch_cache_entries(const void* state, std::size_t n, at_fn at) noexcept : state_(state), n_(n), at_(at) {}
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] stitch_info at(order o, std::size_t i) const noexcept { return at_(state_, o, i); }

 private:
  const void* state_;
  std::size_t n_;
  at_fn at_;
};

/// When: `over_capacity(v)` true: release inactive stitched blocks now, one at a
/// time, until it turns false.
template <class E>
concept EvictionWhen = requires(const E& e, stitch_cache_view v) {
  { e.over_capacity(v) } noexcept -> std::same_as<bool>;
};

/// Which: `victim(entries)` returns the one to release, as given by entries.at()
/// (entries is not empty).
template <class E>
concept EvictionWhich = requires(const E& e, const stitch_cache_entries& entries) {
  { e.victim(entries) } noexcept -> std::same_as<stitch_info>;
};

template <class E>
concept EvictionPolicy = EvictionWhen<E> && EvictionWhich<E>;

} // namespace gmlake
