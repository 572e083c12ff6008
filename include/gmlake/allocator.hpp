// gmlake/allocator.hpp - basic_allocator: the GMLake allocator, built from a
// PhysicalBackend and three policies. It takes the lock and walks each request
// through the BestFit states; the parts it orchestrates live in detail/: the
// arenas (chunks and free ranges), the stitch planner, the stitch pool (stitched
// blocks and their cache) and the stream table.
//
// What holds for the whole interface:
//  - thread safe: every public member takes one lock;
//  - requests are placed at 512-byte granularity; requests of at most
//    options::small_max bytes go to the small arena, which packs them into chunks;
//    larger ones to the large arena, where stitching happens;
//  - BestFit: S1 exact free range or cached stitched block (repaired if a few of its
//    chunks were taken since), S2 split a larger one,
//    S3 stitch free pieces (or map them after a smaller cached stitched block whose
//    pieces are free), S4 create only the shortfall (or a new segment when the
//    stitch policy says so), S5 release the cache, retry, then fail;
//  - failure leaves the state as before the call; nothing is leaked: an undo that
//    fails itself (an unmap, release or address free) is quarantined, never handed
//    out, and retried before growth, in release_cached() and in the destructor
//    (stats().quarantined_bytes, quarantined_stitches, failed_cleanups);
//  - a request fails only when memory has run out: alignment costs only the bytes
//    it needs, growth falls back to smaller handles and to several address ranges;
//  - stream order: memory freed on a stream is reused at once on that stream, on
//    another only once the backend's event says the freeing stream's work is done.
//
// Bad input, defined: 0 bytes is served as 1 byte (a distinct pointer); a request
// larger than the backend's capacity fails at once (nullptr / out_of_memory);
// an alignment that is not a power of two or exceeds max_alignment() gives
// nullptr (bad_alignment at the std::pmr edge); freeing a pointer that is not live
// here (double or foreign free) changes nothing, counts in stats().invalid_frees
// and calls options::on_misuse (default: abort with a message when GMLAKE_DEBUG >= 1),
// outside the allocator's lock: the hook may call the allocator.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <utility>

#include "backend/counting.hpp"
#include "concepts.hpp"
#include "detail/arena.hpp"
#include "detail/footprint.hpp"
#include "detail/node_pool.hpp"
#include "detail/settling.hpp"
#include "detail/stitch_planner.hpp"
#include "detail/stitch_pool.hpp"
#include "detail/stream_table.hpp"
#include "errors.hpp"
#include "policy/eviction.hpp"
#include "policy/fit.hpp"
#include "policy/stitch.hpp"
#include "stats.hpp"

namespace gmlake {

/// Structural settings. How the arenas grow is decided by the stitch policy's S4
/// part (policy/growth.hpp), not here.
struct options {
  std::size_t small_max = std::size_t{1} << 20;  ///< requests up to this go to the small arena
  std::size_t chunk_size = 0;                    ///< the smallest chunk (arena slot); 0: the backend's granularity
  std::size_t va_factor = 2;                     ///< each arena reserves va_factor x capacity of VA
  std::size_t cached_scan = 8;                   ///< cached stitched blocks tried per request
  /// Chunks of a cached stitched block that may be replaced so that it serves a
  /// request (its other chunks free); 0: never. At most 8.
  std::size_t repair_chunks = 4;
  /// A cached stitched block's first piece may start elsewhere in its first chunk,
  /// over free bytes the block maps already (later, past bytes taken at its start;
  /// earlier, by what a request lacks where bytes at its end were taken), so that the
  /// block serves the request with no driver call, or with fewer chunks to replace;
  /// false: it starts where it was stitched.
  bool slide_cached = true;
  /// Room each stitched block's reservation leaves past its mapping, in multiples
  /// of the mapping's bytes: a larger request may append chunks to a cached block
  /// there instead of stitching anew. 0: none (never appended). At most 16.
  std::size_t append_room = 1;
  /// When the job counts as settled, which the growth rules may answer with larger
  /// chunks (growth_view::settled): each time it has asked for settle_window x its
  /// reserved bytes, it is settled if they grew by at most 1/settle_divisor since
  /// the last such point; then it stays settled until release_cached() releases
  /// memory. settle_window 0: never settled.
  std::size_t settle_window = 2;
  std::size_t settle_divisor = 50;
  /// Called on misuse (double or foreign free) with a message, after the allocator's
  /// lock is released (the hook may call the allocator); nullptr: abort with the
  /// message when GMLAKE_DEBUG >= 1, ignore otherwise.
  void (*on_misuse)(const char* what, void* pointer) = nullptr;
};

template <PhysicalBackend Backend, StitchPolicy Stitch = policy::best_fit_pieces,
          EvictionPolicy Evict = policy::lru, FitStrategy Fit = policy::best_fit>
class basic_allocator {
 public:
  using backend_type = Backend;
  using stream_type = typename Backend::stream_type;
  using stitch_type = Stitch;
  using evict_type = Evict;
  using fit_type = Fit;

  /// @throws out_of_memory or backend_error if the address space cannot be reserved.
  explicit basic_allocator(Backend backend, options opt = {}, Stitch stitch = {}, Evict evict = {},
                           Fit fit = {})
      : backend_(std::move(backend)),
        driver_(&backend_),
        opt_(opt),
        stitch_(stitch),
        evict_(evict),
        fit_(fit),
        slot_(opt.chunk_size ? round_up(opt.chunk_size, backend_.granularity()) : backend_.granularity()),
        settling_(opt.settle_window, opt.settle_divisor),
        streams_(driver_),
        small_(driver_, nodes_, streams_, held_, slot_),
        large_(driver_, nodes_, streams_, held_, slot_),
        pool_(driver_, large_, streams_, nodes_, held_) {
    const std::size_t va = round_up(backend_.capacity(), slot_) * (opt_.va_factor ? opt_.va_factor : 1);
    pool_.set_slide(opt_.slide_cached);
    small_.borrow_from(large_);
    if (errc e = small_.open(va); e != errc::ok) fail_open(e);
    if (errc e = large_.open(va); e != errc::ok) {
      small_.close();
      fail_open(e);
    }
    // Every slot boundary of both arenas is a multiple of this: new chunks start at
    // one, so growth serves any alignment up to it with no extra bytes.
    max_alignment_ = std::min({lowest_bit(slot_), lowest_bit(small_.base()), lowest_bit(large_.base())});
  }
  basic_allocator() requires std::default_initializable<Backend> : basic_allocator(Backend{}) {}
  basic_allocator(const basic_allocator&) = delete;
  basic_allocator& operator=(const basic_allocator&) = delete;

  /// Releases every chunk and mapping. Live allocations dangle afterwards (reported
  /// through on_misuse when there are any).
  ~basic_allocator() {
    if (stats_.allocations.current != 0) misuse("allocator destroyed with live allocations", nullptr);
    hold(false);
    (void)streams_.wait_all();
    pool_.close();
    small_.close();
    large_.close();
  }

  /// @brief Allocates `bytes` for use on `stream`.
  /// @return the block, aligned to `alignment` (a power of two, at most the chunk
  ///         size), or nullptr if it cannot be served (the state is unchanged).
  [[nodiscard]] void* try_allocate(std::size_t bytes, stream_type stream = {},
                                   std::size_t alignment = block_alignment) noexcept {
    std::lock_guard lock(mutex_);
    return allocate_locked(bytes, stream, alignment);
  }

  /// @brief As try_allocate.
  /// @throws out_of_memory (carries `bytes`) when it fails for lack of memory (or a
  ///         bad alignment); backend_error with the driver's message when the backend
  ///         reported a driver failure (BackendDiagnostics). The state is unchanged.
  [[nodiscard]] void* allocate(std::size_t bytes, stream_type stream = {},
                               std::size_t alignment = block_alignment) {
    std::unique_lock lock(mutex_);
    if constexpr (BackendDiagnostics<Backend>) backend_.clear_failure();
    if (void* p = allocate_locked(bytes, stream, alignment)) return p;
    if constexpr (BackendDiagnostics<Backend>) {
      if (const char* why = backend_.failure()) {
        std::string message(why);
        lock.unlock();
        throw backend_error(message);
      }
    }
    throw out_of_memory(bytes);
  }

  /// @brief Frees p, last used on `stream`. `bytes` may be 0 (unknown) or the size
  ///        asked for; a different size is misuse (reported; the recorded size is used).
  void deallocate(void* p, std::size_t bytes = 0, stream_type stream = {}) noexcept {
    if (p == nullptr) return;
    misuse_report m;
    {
      std::lock_guard lock(mutex_);
      deallocate_locked(reinterpret_cast<std::uintptr_t>(p), bytes, stream);
      m = std::exchange(misused_, misuse_report{});
    }
    if (m.what != nullptr) misuse(m.what, m.pointer);  // outside the lock: the hook may call us
  }

  /// @brief Unmaps every cached stitched block and releases every unused chunk to
  ///        the backend (torch.cuda.empty_cache). Waits for pending stream work.
  /// @return the physical bytes released.
  std::size_t release_cached() noexcept {
    std::lock_guard lock(mutex_);
    return release_cached_locked();
  }

  /// @brief Forgets `stream` before it is destroyed. The caller promises that its
  ///        work is done (cudaStreamSynchronize): the bytes freed on it become usable
  ///        on every stream at once, and no event is ever recorded on its handle
  ///        again for them. Without this call, a stream destroyed while frees made
  ///        on it are not known done may later get an event recorded on its dead
  ///        handle. A stream made later with the same handle is a new stream to the
  ///        allocator. No effect on the default stream, on CUDA's per-thread default
  ///        stream (its events are recorded at each free) or on a stream not seen.
  void forget_stream(stream_type stream) noexcept {
    std::lock_guard lock(mutex_);
    streams_.forget(stream);
  }

  /// A snapshot of the statistics.
  [[nodiscard]] statistics stats() const {
    std::lock_guard lock(mutex_);
    statistics s = stats_;
    s.reserved_bytes = held_.reserved;
    s.mapped_bytes = held_.mapped;
    s.chunks = held_.chunks;
    s.stitched_blocks = held_.stitched;
    s.quarantined_bytes = held_.quarantined;
    s.quarantined_stitches = held_.quarantined_stitches;
    s.failed_cleanups = held_.failed_cleanups;
    s.stream_waits = streams_.waits();
    s.calls = driver_.counts().calls;
    s.call_failures = driver_.counts().failures;
    return s;
  }
  /// @brief Capture mode, for CUDA graph capture: while on, the allocator makes no
  ///        call that records, queries or waits on an event and releases no memory
  ///        (no unmap, no release, no eviction, no lending between arenas, no release
  ///        and retry before out-of-memory). Memory freed on another stream is not
  ///        reused until the mode is off; requests grow the reserve instead.
  void set_capture_mode(bool on) noexcept {
    std::lock_guard lock(mutex_);
    hold(on);
  }
  [[nodiscard]] bool capture_mode() const noexcept {
    std::lock_guard lock(mutex_);
    return capture_;
  }

  /// @brief Walks the layout, for memory snapshots: `on_segment(layout_segment)` for
  ///        each chunk of the arenas (small, then large) and each stitched block,
  ///        each followed by `on_piece(layout_piece)` for its pieces in address
  ///        order (a chunk's pieces tile it; a stitched block's are its allocation,
  ///        if in use, and the rest of its mapping).
  template <class OnSegment, class OnPiece>
  void visit_layout(OnSegment&& on_segment, OnPiece&& on_piece) const {
    std::lock_guard lock(mutex_);
    for (const arena_type* a : {&small_, &large_}) {
      const auto kind = a == &small_ ? layout_segment::small_chunk : layout_segment::large_chunk;
      a->visit_chunks([&](std::uintptr_t at, std::size_t bytes) { on_segment(layout_segment{at, bytes, kind}); },
                      [&](const range& r, std::uintptr_t at, std::size_t bytes) {
                        layout_piece::state_type st = layout_piece::free;
                        if (r.state == detail::range_state::used)
                          st = r.owner != nullptr ? layout_piece::mapped_by_stitch : layout_piece::allocated;
                        on_piece(layout_piece{at, bytes, st});
                      });
    }
    pool_.visit([&](const stitch_block& b) {
      on_segment(layout_segment{b.va, b.mapped, layout_segment::stitched});
      std::size_t at = 0;
      if (b.in_use) {
        if (b.pointer > b.va) on_piece(layout_piece{b.va, b.pointer - b.va, layout_piece::free});
        on_piece(layout_piece{b.pointer, b.active, layout_piece::allocated});
        at = b.pointer - b.va + b.active;
      }
      if (at < b.mapped) on_piece(layout_piece{b.va + at, b.mapped - at, layout_piece::free});
    });
  }

  void reset_peaks() noexcept {
    std::lock_guard lock(mutex_);
    for (stat* s : {&stats_.requested_bytes, &stats_.active_bytes, &stats_.allocations, &held_.reserved,
                    &held_.mapped, &held_.chunks, &held_.stitched, &held_.quarantined, &held_.quarantined_stitches})
      s->reset_peak();
  }

  /// Where the reserved bytes are now (for tuning; O(ranges)).
  [[nodiscard]] memory_breakdown breakdown() const {
    std::lock_guard lock(mutex_);
    memory_breakdown m;
    const auto s = small_.tally(), l = large_.tally();
    m.requested = static_cast<std::size_t>(stats_.requested_bytes.current);
    m.active = static_cast<std::size_t>(stats_.active_bytes.current);
    m.small_reserved = s.reserved + s.borrowed;  // the bytes each arena places in
    m.small_free = s.free_whole + s.free_partial;
    m.large_reserved = l.reserved - l.lent;
    m.large_free_whole = l.free_whole;
    m.large_free_partial = l.free_partial;
    m.free_pending = s.free_pending + l.free_pending;
    m.cached_stitches = pool_.cached_count();
    m.cached_stitch_bytes = pool_.cached_bytes();
    m.quarantined = s.quarantined + l.quarantined;
    m.quarantined_stitches = pool_.quarantined_count();
    m.quarantined_stitch_bytes = pool_.quarantined_bytes();
    return m;
  }

  /// Checks every structural property, that the stitch reference counts match the
  /// stitched blocks, and that the statistics agree with the structures. Always
  /// compiled; asserted after every operation at GMLAKE_DEBUG 2.
  [[nodiscard]] bool check_invariants() const {
    std::lock_guard lock(mutex_);
    return check_locked();
  }

  /// The smallest chunk: chunk sizes, alignments and the arenas' slots are multiples of it.
  [[nodiscard]] std::size_t chunk_size() const noexcept { return slot_; }
  /// The largest alignment served: the largest power of two that divides chunk_size()
  /// and the start of the arenas' address space. chunk_size() itself where the chunk
  /// is the backend's granularity (the default) or another power of two that the
  /// reservations are aligned to; a chunk of 3 MiB serves alignments up to 1 MiB.
  [[nodiscard]] std::size_t max_alignment() const noexcept { return max_alignment_; }
  /// The backend (for its own inspection and test hooks; do not allocate through it).
  [[nodiscard]] Backend& backend() noexcept { return backend_; }
  [[nodiscard]] const Backend& backend() const noexcept { return backend_; }

 private:
  using driver_type = backend::counting<Backend*>;  // every backend call goes through it: counted once
  using range = detail::range;
  using arena_type = detail::arena<driver_type>;
  using stitch_block = detail::stitch_block;
  using stitch_planner = detail::stitch_planner;

  [[noreturn]] static void fail_open(errc e) {
    if (e == errc::out_of_memory) throw out_of_memory(0);
    throw backend_error("gmlake: could not reserve the address space");
  }

  void misuse(const char* what, void* p) noexcept {
    if (opt_.on_misuse) {
      opt_.on_misuse(what, p);
      return;
    }
#if GMLAKE_DEBUG >= 1
    std::fprintf(stderr, "gmlake: misuse: %s (%p)\n", what, p);
    std::abort();
#endif
  }

  void debug_check() const noexcept {
#if GMLAKE_DEBUG >= 2
    GMLAKE_ASSERT(check_locked(), "invariants broken");
#endif
  }

  // ------------------------------------------------------------ allocate

  void* allocate_locked(std::size_t bytes, stream_type stream, std::size_t alignment) noexcept {
    if (!std::has_single_bit(alignment) || alignment > max_alignment_ || bytes > backend_.capacity())
      return count_oom();
    if (alignment < block_alignment) alignment = block_alignment;
    const std::size_t size = round_up(bytes == 0 ? 1 : bytes, block_alignment);
    std::uint32_t s = 0;
    if (!streams_.index_of(stream, s)) return count_oom();  // host memory ran out
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (void* p = place(size, bytes, s, alignment)) {
        settling_.on_request(bytes, static_cast<std::size_t>(held_.reserved.current));
        debug_check();
        return p;
      }
      if (attempt == 0) {  // S5: release the cache, retry once
        if (capture_) break;  // nothing may be released now
        ++stats_.num_alloc_retries;
        (void)release_cached_locked();
      }
    }
    debug_check();
    return count_oom();
  }

  /// S5: counts the request as out of memory; returns nullptr.
  void* count_oom() noexcept {
    ++stats_.fit[static_cast<std::size_t>(fit_state::s5_oom)];
    ++stats_.num_ooms;
    return nullptr;
  }

  /// Capture mode on or off, in the allocator and each part that defers work in it.
  void hold(bool on) noexcept {
    capture_ = on;
    streams_.set_hold(on);
    pool_.set_hold(on);
    small_.set_hold(on);
    large_.set_hold(on);
  }

  /// The stream rules: may a free range be used on stream `stream` now?
  struct usable_on {
    detail::stream_table<driver_type>* streams;
    std::uint32_t stream;
    bool operator()(const range& r) const noexcept { return streams->usable(r.tag, stream); }
  };

  /// The stream rules and the alignment: may a free range hold the request now?
  /// (At 512 B every free range of at least `size` bytes fits.)
  struct fits_in {
    usable_on usable;
    std::size_t size, alignment;
    bool operator()(const range& r) const noexcept {
      return usable(r) && round_up(r.addr, alignment) + size <= r.end();
    }
  };

  /// BestFit S1-S4 for one request; nullptr when none serves it.
  void* place(std::size_t size, std::size_t requested, std::uint32_t s, std::size_t alignment) noexcept {
    const bool small = size <= opt_.small_max;
    arena_type& a = small ? small_ : large_;
    if (!nodes_.reserve(4)) return nullptr;
    const usable_on usable{&streams_, s};
    const fits_in fits{usable, size, alignment};
    // An aligned stitch starts at a chunk boundary: its pointer is its reservation's start.
    const bool chunk_start = alignment > block_alignment;

    // S1 / S2: one free range.
    if (range* f = a.pick(fit_, size, fits))
      return take(a, *f, size, requested, alignment, f->size == size ? fit_state::s1_exact : fit_state::s2_split);

    const bool stitching = !small && stitch_.stitches(size);
    if (stitching) {
      if (stitch_block* b = pool_.reuse(size, requested, s, opt_.cached_scan, alignment))  // S1 on the cache
        return from_cache(*b, size, requested, fit_state::s1_exact, false);
      if (stitch_block* b = pool_.slide(size, requested, s, opt_.cached_scan, alignment))  // S1 on the cache, moved
        return from_cache(*b, size, requested, fit_state::s1_exact, false);
      if (stitch_block* b = pool_.repair(size, requested, s, opt_.cached_scan, alignment, opt_.repair_chunks))
        return from_cache(*b, size, requested, fit_state::s1_exact, true);  // S1 on the cache, repaired
      if (stitch_block* b = appendable(size, s, alignment)) {  // S3 on the cache, appended
        if (b->capacity >= size) {  // its last chunk's rest was enough
          if (pool_.claim(*b, size, requested, s)) return from_cache(*b, size, requested, fit_state::s1_exact, false);
        } else {
          stitch_planner more(slot_, stitch_.edge_min(), large_.ends(), true);
          if (plan_stitch(more, size - b->capacity, s, false, b) && more.fresh() == 0)
            if (void* p = append(more.pieces(), *b, size, requested, s)) return p;
        }
      }
      stitch_planner plan(slot_, stitch_.edge_min(), large_.ends(), chunk_start);
      if (plan_stitch(plan, size, s, false) && plan.fresh() == 0)
        if (void* p = stitch(plan, size, requested, s, alignment)) return p;  // S3
    }
    retry_quarantine();
    if (lend_before_growth(small, size))  // chunks borrowed or given back: S2 again
      if (range* f = a.pick(fit_, size, fits)) return take(a, *f, size, requested, alignment, fit_state::s2_split);
    if (stitch_.create_shortfall()) {  // S4: create only the shortfall, the fewer new bytes of two ways
      typename arena_type::extension e;
      const bool can_extend = a.find_extension(size, alignment, usable, e);
      stitch_planner plan(slot_, stitch_.edge_min(), large_.ends(), chunk_start);
      const bool can_stitch = stitching && plan_stitch(plan, size, s, true);
      if (can_extend && (!can_stitch || e.bytes <= plan.fresh())) {  // grow a free range by the shortfall
        // The new chunks may have merged with the free range on the hole's other side
        // first, and then not with the neighbour (another stream's pending work): use
        // the result only if it holds the request and is usable; else it stays free.
        if (auto r = a.extend(e, growth(small, e.bytes)); r && fits(*r.value))
          return take(a, *r.value, size, requested, alignment, fit_state::s4_shortfall);
      }
      if (can_stitch) {
        bool grew = false;
        if (void* p = repair_with_new_chunks(size, requested, s, alignment, std::max(plan.fresh(), growth(false).floor), grew))
          return p;
        if (!grew) {
          if (void* p = stitch(plan, size, requested, s, alignment)) return p;  // stitch free pieces with new chunks
        } else {  // the new chunks changed the free ranges: plan again
          stitch_planner again(slot_, stitch_.edge_min(), large_.ends(), chunk_start);
          if (plan_stitch(again, size, s, true))
            if (void* p = stitch(again, size, requested, s, alignment)) return p;
        }
      }
    }
    // S4 without a shortfall path: the request as a new segment. New chunks start at
    // a slot boundary, so any alignment up to the slot needs no extra bytes.
    const std::uint32_t segment = stitch_.create_shortfall() ? 0 : a.new_segment();
    std::uintptr_t fresh = 0;
    const std::size_t bytes = round_up(size, slot_);
    if (auto r = a.grow(bytes, segment, fresh, growth(small, bytes))) {
      // The new chunks may have merged with a free neighbour still in use by another
      // stream: then place the request in the new bytes only.
      if (!usable(*r.value)) return take_at(a, *r.value, fresh, size, requested, fit_state::s4_shortfall);
      return take(a, *r.value, size, requested, alignment, fit_state::s4_shortfall);
    }
    // No hole holds the request (the address space is cut up), though the backend may
    // have the memory: any stitching policy creates it in several holes and stitches.
    if (stitching) return stitch_scattered(size, requested, s, alignment);
    return nullptr;
  }

  /// S4 on the cache: once the job has settled, a cached block that repair() could
  /// not mend for want of free chunks is mended with new chunks of the same bytes,
  /// where they add up to at most twice what the stitch it saves would create
  /// (`budget`) and to at most a quarter of the request: the repair maps only them, a
  /// new stitch every piece, and the free pieces that stitch would have mapped stay
  /// free for the next requests. `grew`: chunks were created (they stay free if the
  /// repair fails).
  void* repair_with_new_chunks(std::size_t size, std::size_t requested, std::uint32_t s, std::size_t alignment,
                               std::size_t budget, bool& grew) noexcept {
    grew = false;
    if (!settling_.settled() || opt_.repair_chunks == 0) return nullptr;
    const auto need = pool_.needed_for_repair(size, s, opt_.cached_scan, alignment, opt_.repair_chunks);
    if (need.count == 0 || need.total > 2 * budget || need.total > size / 4) return nullptr;
    for (std::size_t i = 0; i < need.count; ++i) {
      std::uintptr_t fresh = 0;
      if (!nodes_.reserve(4) || !large_.grow(need.bytes[i], 0, fresh, growth_plan{0, need.bytes[i], 0, 0})) return nullptr;
      grew = true;
    }
    if (!nodes_.reserve(4)) return nullptr;
    stitch_block* b = pool_.repair(size, requested, s, opt_.cached_scan, alignment, opt_.repair_chunks);
    return b == nullptr ? nullptr : from_cache(*b, size, requested, fit_state::s4_shortfall, true);
  }

  /// S4 when no hole holds the shortfall (the address space is cut up, though the
  /// backend has memory): creates it in several holes, then stitches (S3). Runs
  /// only where every other way failed.
  void* stitch_scattered(std::size_t size, std::size_t requested, std::uint32_t s, std::size_t alignment) noexcept {
    const bool chunk_start = alignment > block_alignment;
    std::size_t need = round_up(size, slot_);
    {
      stitch_planner plan(slot_, stitch_.edge_min(), large_.ends(), chunk_start);
      if (plan_stitch(plan, size, s, true)) need = plan.fresh();
    }
    const std::size_t pieces = stitch_.max_pieces();
    if (need == 0 || pieces == 0 || large_.grow_scattered(need, pieces, growth(false)) < need) return nullptr;
    stitch_planner plan(slot_, stitch_.edge_min(), large_.ends(), chunk_start);
    if (!plan_stitch(plan, size, s, false) || plan.fresh() != 0) return nullptr;  // the new chunks stay free
    void* p = stitch(plan, size, requested, s, alignment);
    if (p != nullptr) {  // counted as what it is: new chunks
      --stats_.fit[static_cast<std::size_t>(fit_state::s3_stitch)];
      ++stats_.fit[static_cast<std::size_t>(fit_state::s4_shortfall)];
    }
    return p;
  }

  void* take(arena_type& a, range& f, std::size_t size, std::size_t requested, std::size_t alignment,
             fit_state st) noexcept {
    return take_at(a, f, f.addr + (alignment - (f.addr % alignment)) % alignment, size, requested, st);
  }

  void* take_at(arena_type& a, range& f, std::uintptr_t at, std::size_t size, std::size_t requested,
                fit_state st) noexcept {
    range& u = a.carve(f, at, size);
    u.requested = requested;
    on_allocated(requested, size, st);
    return reinterpret_cast<void*>(u.addr);
  }

  /// The request served by cached stitched block b, claimed already (`repaired`:
  /// after some of its chunks were replaced).
  void* from_cache(stitch_block& b, std::size_t size, std::size_t requested, fit_state st, bool repaired) noexcept {
    on_allocated(requested, size, st);
    ++stats_.cached_stitch_hits;
    if (repaired) ++stats_.cached_stitch_repairs;
    return reinterpret_cast<void*>(b.pointer);
  }

  void on_allocated(std::size_t requested, std::size_t size, fit_state st) noexcept {
    ++stats_.fit[static_cast<std::size_t>(st)];
    stats_.requested_bytes.add(static_cast<std::int64_t>(requested));
    stats_.active_bytes.add(static_cast<std::int64_t>(size));
    stats_.allocations.add(1);
  }

  /// Offers the large arena's usable free ranges to the planner, largest first
  /// (none under the pieces of `besides`, a block to append to), and plans a stitch
  /// of `size` bytes (with new chunks for the rest if `shortfall`).
  bool plan_stitch(stitch_planner& plan, std::size_t size, std::uint32_t s, bool shortfall,
                   const stitch_block* besides = nullptr) noexcept {
    const usable_on usable{&streams_, s};
    const auto under_besides = [&](const range& r) {
      if (besides != nullptr)
        for (const auto& p : besides->pieces)
          if (p.addr < r.end() && r.addr < p.end()) return true;
      return false;
    };
    large_.for_each_free_largest([&](const range& r) {
      if (plan.full()) return false;
      if (usable(r) && !under_besides(r)) plan.offer(large_.source_of(r));
      return true;
    });
    return plan.plan(stitch_, size, shortfall);
  }

  /// A cached stitched block that a request of `size` bytes can use with chunks
  /// appended to it, or nullptr.
  stitch_block* appendable(std::size_t size, std::uint32_t s, std::size_t alignment) noexcept {
    if (opt_.append_room == 0) return nullptr;
    return pool_.appendable(size, s, opt_.cached_scan, alignment, slot_);
  }

  /// S3 on a cached block, appended: has the pool map `pieces` (free, from a chunk
  /// boundary) after b's and claim the request's prefix.
  void* append(std::span<const detail::stitch_piece> pieces, stitch_block& b, std::size_t size,
               std::size_t requested, std::uint32_t s) noexcept {
    if (!pool_.append(b, pieces)) return nullptr;
    ++stats_.cached_stitch_appends;
    if (!pool_.claim(b, size, requested, s)) return nullptr;  // stays cached, appended
    on_allocated(requested, size, fit_state::s3_stitch);
    return reinterpret_cast<void*>(b.pointer);
  }

  /// S3 (or S4 when the plan needs new bytes): creates the new chunks, then has the
  /// pool map the pieces and claim the request's prefix.
  void* stitch(stitch_planner& plan, std::size_t size, std::size_t requested, std::uint32_t s,
               std::size_t alignment) noexcept {
    std::span<const detail::stitch_piece> pieces = plan.pieces();
    if (plan.fresh() > 0) {
      std::uintptr_t fresh = 0;  // at the start of the best-fitting hole
      if (!large_.grow(plan.fresh(), 0, fresh, growth(false))) return nullptr;
      pieces = plan.add_fresh(fresh);
    }
    stitch_block* b = pool_.build(pieces, opt_.append_room);
    if (b == nullptr) return nullptr;
    if (b->pointer % alignment != 0 || !pool_.claim(*b, size, requested, s)) {
      // Not aligned (a reservation aligned to less than the slot), or
      // new chunks merged with a neighbour another stream still uses: give up on it.
      pool_.discard(*b);
      return nullptr;
    }
    on_allocated(requested, size, plan.fresh() ? fit_state::s4_shortfall : fit_state::s3_stitch);
    return reinterpret_cast<void*>(b->pointer);
  }

  // ------------------------------------------------------------ growth

  /// How an arena grows now, as the stitch policy says; `request`: the bytes of the
  /// one request that fills the new bytes of the large arena (0: none does).
  [[nodiscard]] growth_plan growth(bool small, std::size_t request = 0) const noexcept {
    return stitch_.growth({slot_, static_cast<std::size_t>(held_.reserved.current), backend_.capacity(), small,
                           (small ? small_ : large_).reserved(), settling_.settled(), small ? 0 : request});
  }

  /// Before an arena grows past the peak reserved so far, the other one releases
  /// free chunks as the stitch policy's lending says, so that bytes move to where
  /// they are needed instead of adding up; or the small arena borrows a free chunk
  /// of the large one, and gives such chunks back, once free, before the large arena
  /// grows (true when either happened: place the request again). Only chunks whose stream work is
  /// done now: it asks the streams (an event query) and never waits, since a wait here,
  /// in the middle of a training step, would drain the device's queue; chunks still
  /// in use by queued work are lent at a later growth.
  bool lend_before_growth(bool small, std::size_t size) noexcept {
    if (capture_) return false;
    const lending l = stitch_.lends();
    const std::int64_t now = held_.reserved.current, peak = held_.reserved.peak;
    if (small) {
      const std::size_t need = round_up(size, slot_);
      if (now + static_cast<std::int64_t>(std::max(need, growth(true).floor)) <= peak) return false;
      // Borrow once the job has settled, and only while its live bytes are below 4/5
      // of their peak (between its largest phases: what the small arena takes now
      // comes back before the large arena needs the chunk again).
      if (l.borrow_max >= need && settling_.settled() && 5 * stats_.active_bytes.current < 4 * stats_.active_bytes.peak) {
        streams_.poll_all();
        if (auto r = small_.borrow(need, l.borrow_max, stitch_planner::max_candidates, 0)) {
          stats_.borrowed_bytes += r.value->size;
          return true;
        }
      }
      if (l.to_small) {
        streams_.poll_all();
        stats_.lent_bytes += large_.release_one_chunk(slot_, stitch_planner::max_candidates);
      }
      return false;
    }
    bool back = false;
    if (small_.borrowed() != 0) {
      streams_.poll_all();
      small_.coalesce_all();
      back = small_.give_back_borrowed() != 0;
    }
    if (l.to_large && now + static_cast<std::int64_t>(size) > peak && small_.free_count() != 0) {
      streams_.poll_all();
      small_.coalesce_all();
      stats_.lent_bytes += small_.release_free_chunks();
    }
    return back;
  }

  /// Retries the undo of what failed to be undone before (stitched blocks first:
  /// they pin chunks). No backend call when nothing is quarantined.
  void retry_quarantine() noexcept {
    if (capture_) return;  // no unmap or release while capturing
    pool_.retry_quarantine();
    small_.retry_quarantine();
    large_.retry_quarantine();
  }

  // ------------------------------------------------------------ free

  void deallocate_locked(std::uintptr_t p, std::size_t bytes, stream_type stream) noexcept {
    std::uint32_t s = 0;  // the default stream's index, where stream has none
    if (!streams_.index_of(stream, s) && !streams_.drain(stream)) {
      // No room to add the stream, and its work cannot be waited for now (capture mode,
      // or an event call failed): the block stays allocated rather than be reused
      // while that work may still use it (it stays counted as allocated).
      return;
    }
    for (arena_type* a : {&small_, &large_}) {
      if (!a->contains(p)) continue;
      range* r = a->starting_at(p);
      if (r == nullptr || r->state != detail::range_state::used || r->owner != nullptr) {
        invalid_free(r != nullptr && r->is_free() ? "double free" : "free of a pointer not allocated here", p);
        return;
      }
      if (bytes != 0 && bytes != r->requested) note_misuse("free with a size other than the one allocated", p);
      on_freed(r->requested, r->size);
      a->release(*r, streams_.on_free(s));
      debug_check();
      return;
    }
    stitch_block* b = pool_.find(p);
    if (b == nullptr || !b->in_use) {
      invalid_free(b == nullptr ? "free of a pointer not allocated here" : "double free", p);
      return;
    }
    if (bytes != 0 && bytes != b->requested) note_misuse("free with a size other than the one allocated", p);
    on_freed(b->requested, b->active);
    const auto tag = streams_.on_free(s);
    pool_.release(*b, tag);
    // repair() remaps a cached block only once the work before its free is done,
    // and asks without waiting: an event after the free answers it later.
    if (opt_.repair_chunks != 0) streams_.mark(tag);
    stats_.evictions += pool_.evict(evict_);
    debug_check();
  }

  void invalid_free(const char* what, std::uintptr_t p) noexcept {
    ++stats_.invalid_frees;
    note_misuse(what, p);
  }

  /// Misuse seen under the lock, reported by deallocate() once it is released.
  struct misuse_report {
    const char* what = nullptr;
    void* pointer = nullptr;
  };
  void note_misuse(const char* what, std::uintptr_t p) noexcept { misused_ = {what, reinterpret_cast<void*>(p)}; }

  void on_freed(std::size_t requested, std::size_t size) noexcept {
    stats_.requested_bytes.sub(static_cast<std::int64_t>(requested));
    stats_.active_bytes.sub(static_cast<std::int64_t>(size));
    stats_.allocations.sub(1);
  }

  std::size_t release_cached_locked() noexcept {
    if (capture_) return 0;
    pool_.unmap_cached();
    (void)streams_.wait_all();
    retry_quarantine();
    small_.coalesce_all();
    (void)small_.give_back_borrowed();
    large_.coalesce_all();
    const std::size_t released = small_.release_free_chunks() + large_.release_free_chunks();
    if (released != 0) settling_.reset();
    debug_check();
    return released;
  }

  // ------------------------------------------------------------ invariants

  bool check_locked() const noexcept {
    std::size_t reserved = 0, used = 0, live = 0;
    if (!small_.check(reserved, used, live) || !large_.check(reserved, used, live)) return false;
    if (!pool_.check(live) || !small_.check_refs({})) return false;
    if (static_cast<std::int64_t>(reserved) != held_.reserved.current) return false;
    if (static_cast<std::int64_t>(used) != stats_.active_bytes.current) return false;
    if (static_cast<std::int64_t>(live) != stats_.allocations.current) return false;
    if (small_.borrowed() + small_.owed() != large_.lent() || large_.borrowed() != 0) return false;
    if (static_cast<std::int64_t>(reserved + small_.borrowed() + pool_.mapped_bytes()) != held_.mapped.current)
      return false;
    const std::size_t quarantined = small_.tally().quarantined + large_.tally().quarantined;
    if (static_cast<std::int64_t>(quarantined) != held_.quarantined.current) return false;
    return true;
  }

  Backend backend_;
  driver_type driver_;
  options opt_;
  [[no_unique_address]] Stitch stitch_;
  [[no_unique_address]] Evict evict_;
  [[no_unique_address]] Fit fit_;
  std::size_t slot_;
  std::size_t max_alignment_ = 0;  // set once the arenas are open
  detail::settling settling_;  // is the job settled? (options::settle_window)
  bool capture_ = false;  // set_capture_mode
  misuse_report misused_;  // under the lock: the misuse deallocate() reports after it
  statistics stats_;      // the request side; the footprint and the calls are added by stats()
  detail::footprint held_;
  detail::node_pool<range> nodes_;
  detail::stream_table<driver_type> streams_;
  arena_type small_;
  arena_type large_;
  detail::stitch_pool<driver_type> pool_;
  mutable std::mutex mutex_;
};

} // namespace gmlake
