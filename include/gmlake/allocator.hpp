// gmlake/allocator.hpp - basic_allocator: the GMLake allocator, built from a
// PhysicalBackend and three policies.
//
// What holds for the whole interface:
//  - thread safe: every public member takes one lock;
//  - requests are placed at 512-byte granularity; requests of at most
//    options::small_max bytes go to the small arena, which packs them into chunks;
//    larger ones to the large arena, where stitching happens;
//  - BestFit: S1 exact free range or cached stitched block, S2 split a larger one,
//    S3 stitch free pieces, S4 create only the shortfall (or a new segment when the
//    stitch policy says so), S5 release the cache, retry, then fail;
//  - failure leaves the state as before the call; nothing is leaked;
//  - stream order: memory freed on a stream is reused at once on that stream, on
//    another only once the backend's event says the freeing stream's work is done.
//
// Bad input, defined: 0 bytes is served as 1 byte (a distinct pointer); a request
// larger than the backend's capacity fails at once (nullptr / out_of_memory);
// an alignment that is not a power of two or exceeds the chunk granularity gives
// nullptr (bad_alignment at the std::pmr edge); freeing a pointer that is not live
// here (double or foreign free) changes nothing, counts in stats().invalid_frees
// and calls options::on_misuse (default: abort with a message when GMLAKE_DEBUG >= 1).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <span>
#include <string>

#include "concepts.hpp"
#include "detail/arena.hpp"
#include "detail/node_pool.hpp"
#include "detail/stitch_block.hpp"
#include "detail/stream_table.hpp"
#include "errors.hpp"
#include "policy/eviction.hpp"
#include "policy/fit.hpp"
#include "policy/stitch.hpp"
#include "stats.hpp"

namespace gmlake {

/// Tunables that are not policies.
struct options {
  std::size_t small_max = std::size_t{1} << 20;  ///< requests up to this go to the small arena
  std::size_t chunk_size = 0;                    ///< chunk bytes; 0: the backend's granularity
  std::size_t va_factor = 2;                     ///< each arena reserves va_factor x capacity of VA
  std::size_t cached_scan = 8;                   ///< cached stitched blocks tried per request
  /// Largest physical handle that growth of the large arena creates at once (a
  /// multiple of chunk_size; 0 or chunk_size: one handle per chunk; 32 MiB measured
  /// best across bench/ traces, docs/benchmarks.md). Driver cost
  /// grows with the number of handles, not bytes; stitching maps whole handles.
  std::size_t max_handle = std::size_t{32} << 20;
  /// Before growth of the large arena that would pass the peak reserved, release the
  /// small arena's free whole chunks (waits for pending stream work first; only at new peaks).
  bool lend_at_peak = true;
  /// Before growth of the small arena that would pass the peak reserved, release one
  /// unpinned free handle of the large arena (the smallest found), so bytes move the
  /// other way too. Off by default: it fixes synth-kvcache (3.3% -> 1.4%) but churns on
  /// training traces (llama1b-lora-ckpt 1.9% -> 2.9%, gpt2m 0.5% -> 1.1%).
  bool lend_to_small_at_peak = false;
  /// Growth of the large arena creates at least this many bytes (capped at max_handle,
  /// so one handle), the rest staying free: fewer, larger handles for later stitches
  /// to map (llama1b-generate: 3238 -> 1409 modelled driver us per iteration). Applies
  /// only with a stitch policy that stitches and creates shortfalls (the gmlake
  /// configuration), where the surplus is reused by the next stitch or split.
  std::size_t min_growth = std::size_t{16} << 20;
  /// ... and at least reserved / growth_divisor (0: no such term; capped at max_handle
  /// too): the surplus stays a small fraction of the footprint.
  std::size_t growth_divisor = 512;
  /// A growth of the large arena of at least big_growth bytes (a new peak for a
  /// very large request) creates handles of up to big_handle bytes instead of
  /// max_handle (0: off): gpt2l-fsdp-dyn's 2.4 GB logits cost 74 handles at 32 MiB.
  /// Applies with the same policies as min_growth.
  std::size_t big_growth = std::size_t{768} << 20;
  std::size_t big_handle = std::size_t{256} << 20;
  /// Stitch edges (0: off): a free range that holds no whole handle but reaches a
  /// handle boundary may open a stitch with its bytes before the boundary, or close
  /// it with those after, where the stitch would otherwise create new chunks; at
  /// least this many bytes each. Less reserved memory, more handles mapped per stitch
  /// (8 MiB: llama1b-lora-ckpt 1.9% -> 1.3%, gpt2l-fsdp-dyn 0.31% -> 0.2%, but
  /// llama1b-generate 1409 -> 1883 modelled driver us per iteration; docs/benchmarks.md).
  std::size_t stitch_edge_min = 0;
  /// Called on misuse (double or foreign free) with a message; nullptr: abort with the
  /// message when GMLAKE_DEBUG >= 1, ignore otherwise.
  void (*on_misuse)(const char* what, void* pointer) = nullptr;
};

template <PhysicalBackend Backend, StitchPolicy Stitch = policy::best_fit_pieces,
          EvictionPolicy Evict = policy::lru, FitStrategy Fit = policy::best_fit>
class basic_allocator {
 public:
  using backend_type = Backend;
  using stream_type = typename Backend::stream_type;

  /// @throws out_of_memory or backend_error if the address space cannot be reserved.
  explicit basic_allocator(Backend backend, options opt = {}, Stitch stitch = {}, Evict evict = {},
                           Fit fit = {})
      : backend_(std::move(backend)),
        opt_(opt),
        stitch_(stitch),
        evict_(evict),
        fit_(fit),
        chunk_(opt.chunk_size ? round_up(opt.chunk_size, backend_.granularity()) : backend_.granularity()),
        streams_(backend_, stats_),
        small_(backend_, nodes_, streams_, stats_, chunk_),
        large_(backend_, nodes_, streams_, stats_, chunk_, round_up(opt.max_handle, chunk_)) {
    const std::size_t va = round_up(backend_.capacity(), chunk_) * (opt_.va_factor ? opt_.va_factor : 1);
    if (errc e = small_.open(va); e != errc::ok) fail_open(e);
    if (errc e = large_.open(va); e != errc::ok) {
      small_.close();
      fail_open(e);
    }
    large_base_ = large_.base();
    if (stitch_.max_pieces() > 0 && stitch_.create_shortfall()) {
      // Capped at max_handle (one handle) and at capacity / 1024 (no effect on small devices).
      const std::size_t cap = std::min(round_up(opt_.max_handle, chunk_), backend_.capacity() / 1024);
      large_.set_min_growth(opt_.min_growth, opt_.growth_divisor, cap);
      large_.set_big_growth(opt_.big_growth, opt_.big_handle);
    }
  }
  basic_allocator() requires std::default_initializable<Backend> : basic_allocator(Backend{}) {}
  basic_allocator(const basic_allocator&) = delete;
  basic_allocator& operator=(const basic_allocator&) = delete;

  /// Releases every chunk and mapping. Live allocations dangle afterwards (reported
  /// through on_misuse when there are any).
  ~basic_allocator() {
    capture_ = false;
    streams_.set_hold(false);
    if (stats_.allocations.current != 0) misuse("allocator destroyed with live allocations", nullptr);
    (void)streams_.wait_all();
    while (!by_pointer_.empty()) unmap_stitch(*by_pointer_.begin(), true);
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
    std::lock_guard lock(mutex_);
    deallocate_locked(reinterpret_cast<std::uintptr_t>(p), bytes, stream);
  }

  /// @brief Unmaps every cached stitched block and releases every unused chunk to
  ///        the backend (torch.cuda.empty_cache). Waits for pending stream work.
  /// @return the physical bytes released.
  std::size_t release_cached() noexcept {
    std::lock_guard lock(mutex_);
    return release_cached_locked();
  }

  /// A snapshot of the statistics.
  [[nodiscard]] statistics stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  /// @brief Capture mode, for CUDA graph capture: while on, the allocator makes no
  ///        call that records, queries or waits on an event and releases no memory
  ///        (no unmap, no release, no eviction, no lending between arenas, no release
  ///        and retry before out-of-memory). Memory freed on another stream is not
  ///        reused until the mode is off; requests grow the reserve instead.
  void set_capture_mode(bool on) noexcept {
    std::lock_guard lock(mutex_);
    capture_ = on;
    streams_.set_hold(on);
  }
  [[nodiscard]] bool capture_mode() const noexcept {
    std::lock_guard lock(mutex_);
    return capture_;
  }

  /// @brief Walks the layout for snapshots: `on_segment(layout_segment)` for each
  ///        handle of the arenas (small, then large) and each stitched block, each
  ///        followed by `on_piece(layout_piece)` for its pieces in address order (a
  ///        handle's pieces tile it; a stitched block's are its allocation, if
  ///        active, and the rest of its mapping).
  template <class OnSegment, class OnPiece>
  void visit_layout(OnSegment&& on_segment, OnPiece&& on_piece) const {
    std::lock_guard lock(mutex_);
    for (const arena_type* a : {&small_, &large_}) {
      const auto kind = a == &small_ ? layout_segment::small_handle : layout_segment::large_handle;
      a->visit_handles([&](std::uintptr_t at, std::size_t bytes) { on_segment(layout_segment{at, bytes, kind}); },
                       [&](const range& r) {
                         layout_piece::state_type st = layout_piece::free;
                         if (r.state == detail::range_state::used)
                           st = r.owner != nullptr ? layout_piece::mapped_by_stitch : layout_piece::allocated;
                         on_piece(layout_piece{r.addr, r.size, st});
                       });
    }
    for (const stitch_block& b : by_pointer_) {
      on_segment(layout_segment{b.va, b.mapped, layout_segment::stitched});
      std::size_t at = 0;
      if (b.in_use) {
        if (b.pointer > b.va) on_piece(layout_piece{b.va, b.pointer - b.va, layout_piece::free});
        on_piece(layout_piece{b.pointer, b.active, layout_piece::allocated});
        at = b.pointer - b.va + b.active;
      }
      if (at < b.mapped) on_piece(layout_piece{b.va + at, b.mapped - at, layout_piece::free});
    }
  }

  void reset_peaks() noexcept {
    std::lock_guard lock(mutex_);
    for (stat* s : {&stats_.requested_bytes, &stats_.active_bytes, &stats_.reserved_bytes, &stats_.mapped_bytes,
                    &stats_.chunks, &stats_.stitched_blocks, &stats_.allocations})
      s->reset_peak();
  }

  /// Where the reserved bytes are now (for tuning; O(ranges)).
  [[nodiscard]] memory_breakdown breakdown() const {
    std::lock_guard lock(mutex_);
    memory_breakdown m;
    const auto s = small_.tally(), l = large_.tally();
    m.requested = static_cast<std::size_t>(stats_.requested_bytes.current);
    m.active = static_cast<std::size_t>(stats_.active_bytes.current);
    m.small_reserved = s.reserved;
    m.small_free = s.free_whole + s.free_partial;
    m.large_reserved = l.reserved;
    m.large_free_whole = l.free_whole;
    m.large_free_partial = l.free_partial;
    m.free_pending = s.free_pending + l.free_pending;
    m.cached_stitches = lru_.size();
    m.cached_stitch_bytes = cached_bytes_;
    return m;
  }

  /// Checks every structural property and that the statistics agree with the
  /// structures. Always compiled; asserted after every operation at GMLAKE_DEBUG 2.
  [[nodiscard]] bool check_invariants() const {
    std::lock_guard lock(mutex_);
    return check_locked();
  }

  [[nodiscard]] std::size_t chunk_size() const noexcept { return chunk_; }
  /// The backend (for its own inspection and test hooks; do not allocate through it).
  [[nodiscard]] Backend& backend() noexcept { return backend_; }
  [[nodiscard]] const Backend& backend() const noexcept { return backend_; }
  [[nodiscard]] const Stitch& stitch_policy() const noexcept { return stitch_; }

 private:
  using range = detail::range;
  using arena_type = detail::arena<Backend>;
  using stitch_block = detail::stitch_block;
  static constexpr std::size_t max_candidates = 64;

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

  void count(call c, std::uint64_t n = 1) noexcept { stats_.calls[static_cast<std::size_t>(c)] += n; }

  void debug_check() const noexcept {
#if GMLAKE_DEBUG >= 2
    GMLAKE_ASSERT(check_locked(), "invariants broken");
#endif
  }

  // ------------------------------------------------------------ allocate

  void* allocate_locked(std::size_t bytes, stream_type stream, std::size_t alignment) noexcept {
    if (!std::has_single_bit(alignment) || alignment > chunk_ || bytes > backend_.capacity()) {
      ++stats_.fit[static_cast<std::size_t>(fit_state::s5_oom)];
      ++stats_.num_ooms;
      return nullptr;
    }
    if (alignment < block_alignment) alignment = block_alignment;
    const std::size_t size = round_up(bytes == 0 ? 1 : bytes, block_alignment);
    std::uint32_t s = 0;
    if (!streams_.index_of(stream, s)) return nullptr;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (void* p = place(size, bytes, s, alignment)) {
        debug_check();
        return p;
      }
      if (attempt == 0) {
        if (capture_) break;  // nothing may be released now
        ++stats_.num_alloc_retries;
        (void)release_cached_locked();
      }
    }
    ++stats_.fit[static_cast<std::size_t>(fit_state::s5_oom)];
    ++stats_.num_ooms;
    debug_check();
    return nullptr;
  }

  struct usable_on {
    detail::stream_table<Backend>* streams;
    std::uint32_t stream;
    bool operator()(const range& r) const noexcept { return streams->usable(r.tag, stream); }
  };

  void* place(std::size_t size, std::size_t requested, std::uint32_t s, std::size_t alignment) noexcept {
    const bool small = size <= opt_.small_max;
    arena_type& a = small ? small_ : large_;
    const std::size_t slack = alignment - block_alignment;
    if (!nodes_.reserve(4)) return nullptr;
    const usable_on usable{&streams_, s};

    // S1 / S2: one free range.
    if (const range* f = fit_.pick(a.free_ranges(), size + slack, detail::range_filter(usable)))
      return take(a, const_cast<range&>(*f), size, requested, alignment,
                  f->size == size ? fit_state::s1_exact : fit_state::s2_split);

    const bool stitching = !small && stitch_.stitches(size) && alignment <= block_alignment;
    if (stitching) {
      if (void* p = reuse_stitch(size, requested, s)) return p;  // S1 on the cache
      stitch_plan plan;
      if (plan_stitch(size, s, false, plan) && plan.fresh == 0)
        if (void* p = stitch(plan, size, requested, s)) return p;  // S3
    }
    // Growth of the small arena that would pass the peak reserved: release a free
    // handle of the large arena first (options::lend_to_small_at_peak).
    if (small && opt_.lend_to_small_at_peak && !capture_ &&
        stats_.reserved_bytes.current + static_cast<std::int64_t>(chunk_) > stats_.reserved_bytes.peak)
    {
      (void)streams_.wait_all();
      stats_.lent_bytes += large_.release_one_handle(chunk_, max_candidates);
    }
    // Growth of the large arena is next. If it would pass the peak reserved so far,
    // first give the small arena's free whole chunks back, so physical memory moves
    // to where it is needed instead of adding up (options::lend_at_peak). Only this
    // way: releasing large-arena chunks for the small one churns (measured).
    if (opt_.lend_at_peak && !small && !capture_ &&
        stats_.reserved_bytes.current + static_cast<std::int64_t>(size) > stats_.reserved_bytes.peak)
      lend(small_);
    if (stitch_.create_shortfall()) {  // S4: create only the shortfall, the fewer new bytes of two ways
      typename arena_type::extension e;
      const bool can_extend = a.find_extension(size + slack, usable, e);
      stitch_plan plan;
      const bool can_stitch = stitching && plan_stitch(size, s, true, plan);
      if (can_extend && (!can_stitch || e.bytes <= plan.fresh)) {  // grow a free range by the shortfall
        // The new chunks may have merged with the free range on the hole's other side
        // first, and then not with the neighbour (another stream's pending work): use
        // the result only if it holds the request and is usable; else it stays free.
        if (auto r = a.extend(e); r && r.value->size >= size + slack && usable(*r.value))
          return take(a, *r.value, size, requested, alignment, fit_state::s4_shortfall);
      }
      if (can_stitch) {
        if (void* p = stitch(plan, size, requested, s)) return p;  // stitch free pieces with new chunks
      }
    }
    const std::uint32_t segment = stitch_.create_shortfall() ? 0 : a.new_segment();
    std::uintptr_t fresh = 0;
    if (auto r = a.grow(round_up(size + slack, chunk_), segment, fresh)) {
      // The new chunks may have merged with a free neighbour still in use by another
      // stream: then place the request in the new bytes only.
      if (!usable(*r.value)) return take_at(a, *r.value, fresh, size, requested, fit_state::s4_shortfall);
      return take(a, *r.value, size, requested, alignment, fit_state::s4_shortfall);
    }
    return nullptr;
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

  void on_allocated(std::size_t requested, std::size_t size, fit_state st) noexcept {
    ++stats_.fit[static_cast<std::size_t>(st)];
    stats_.requested_bytes.add(static_cast<std::int64_t>(requested));
    stats_.active_bytes.add(static_cast<std::int64_t>(size));
    stats_.allocations.add(1);
  }

  /// S1 on the sPool: a cached stitched block of at least `size` whose prefix pieces are free.
  void* reuse_stitch(std::size_t size, std::size_t requested, std::uint32_t s) noexcept {
    auto it = cache_.lower_bound(size, detail::stitch_capacity_less{});
    for (std::size_t n = 0; it != cache_.end() && n < opt_.cached_scan; ++it, ++n) {
      stitch_block& b = *it;
      if (activate(b, size, requested, s, fit_state::s1_exact)) {
        ++stats_.cached_stitch_hits;
        return reinterpret_cast<void*>(b.pointer);
      }
    }
    return nullptr;
  }

  /// Claims the arena ranges of b's first `size` bytes, if all are free and usable on s.
  bool activate(stitch_block& b, std::size_t size, std::size_t requested, std::uint32_t s, fit_state st) noexcept {
    std::size_t left = size, k = 0;
    for (; left > 0 && k < b.pieces.size(); ++k) {
      const auto& p = b.pieces[k];
      const std::size_t len = left < p.size ? left : p.size;
      range& r = large_.holding(p.addr);
      if (!r.is_free() || p.addr + len > r.end() || !streams_.usable(r.tag, s)) return false;
      left -= len;
    }
    if (left > 0 || !nodes_.reserve(2 * k)) return false;
    left = size;
    for (std::size_t i = 0; i < k; ++i) {
      const auto& p = b.pieces[i];
      const std::size_t len = left < p.size ? left : p.size;
      range& u = large_.carve(large_.holding(p.addr), p.addr, len);
      u.owner = &b;
      b.claimed[i] = &u;
      left -= len;
    }
    b.claimed_count = k;
    if (b.cached) {
      cache_.erase(cache_.iterator_to(b));
      lru_.erase(lru_.iterator_to(b));
      cached_bytes_ -= b.mapped;
      b.cached = false;
    }
    b.in_use = true;
    b.requested = requested;
    b.active = size;
    on_allocated(requested, size, st);
    return true;
  }

  /// A stitch worked out but not built: pieces_[0, pieces) from free ranges, and
  /// `fresh` new bytes (whole chunks) still to create for the rest, placed before
  /// the last piece when `closing_edge` (else after it).
  struct stitch_plan {
    std::size_t pieces = 0;
    std::size_t fresh = 0;
    bool closing_edge = false;
  };

  /// Free bytes of a range with no whole handle that touch a handle boundary: those
  /// that end at one can open a stitch, those that start at one can close it.
  struct stitch_edge {
    std::uintptr_t addr = 0;
    std::size_t bytes = 0;
  };
  void note_edges(const range& r, stitch_edge& opening, stitch_edge& closing) const noexcept {
    const std::uintptr_t floor = large_.handle_floor(r.addr);
    const std::uintptr_t boundary = floor == r.addr ? r.addr : large_.handle_end(r.addr);
    if (boundary > r.end()) return;  // inside one handle, touching no boundary
    const std::size_t before = boundary - r.addr, after = r.end() - boundary;
    if (before >= opt_.stitch_edge_min && before > opening.bytes) opening = {r.addr, before};
    if (after >= opt_.stitch_edge_min && after > closing.bytes) closing = {boundary, after};
  }

  /// Picks the pieces of a stitch of `size` bytes from the largest usable free
  /// ranges (the policy chooses the ones with whole handles). The free bytes at a
  /// handle boundary of a range with none (stitch_edge) may open or close the stitch
  /// where they give more than the chosen pieces' own head or tail. False when there
  /// is nothing to stitch, or when the pieces fall short and `shortfall` does not
  /// allow new chunks.
  bool plan_stitch(std::size_t size, std::uint32_t s, bool shortfall, stitch_plan& plan) noexcept {
    const usable_on usable{&streams_, s};
    std::size_t n = 0;
    stitch_edge opening, closing;
    for (auto it = large_.free_ranges().rbegin(); it != large_.free_ranges().rend() && n < max_candidates; ++it) {
      if (it->size < chunk_) break;
      if (!usable(*it)) continue;
      const auto sp = large_.split_of(*it);
      if (sp.whole == 0) {
        if (opt_.stitch_edge_min != 0) note_edges(*it, opening, closing);
        continue;
      }
      candidates_[n++] = stitch_candidate{it->addr, sp.head, sp.whole, sp.tail};
    }
    const std::span<stitch_candidate> c(candidates_.data(), n);
    const std::size_t k = n ? stitch_.select(c, size) : 0;
    if (k > n || (k == 0 && (n != 0 || opening.bytes + closing.bytes == 0))) return false;
    std::size_t got = 0, m = 0;
    bool tail_taken = false;
    plan.closing_edge = false;
    // Lay the pieces out: the first may start at its head (or an opening edge goes
    // first), the last may end at its tail (or a closing edge goes last). Edges
    // only where the pieces fall short: each maps one more handle.
    const auto lay_out = [&](bool open_edge) {
      got = m = 0;
      tail_taken = false;
      if (open_edge) {
        pieces_[m++] = {opening.addr, std::min(opening.bytes, size)};
        got += pieces_[0].size;
      }
      for (std::size_t i = 0; i < k && got < size; ++i) {
        const auto& x = c[i];
        std::uintptr_t lo = x.addr + x.head;
        std::size_t len = x.whole;
        if (i == 0 && !open_edge) {
          lo = x.addr;
          len += x.head;
        }
        if (!shortfall && i + 1 == k) {
          len += x.tail;
          tail_taken = x.tail > 0;
        }
        if (got + len > size) {  // the last piece: only the handles the request needs
          const std::uintptr_t end = large_.handle_end(lo + (size - got) - 1);
          len = std::min<std::size_t>(len, end - lo);
        }
        pieces_[m++] = {lo, len};
        got += len;
      }
    };
    lay_out(false);
    if (got < size && opening.bytes > (k ? c[0].head : 0)) {
      const std::size_t short_by = round_up(size - got, chunk_);
      lay_out(true);
      if (got < size && round_up(size - got, chunk_) >= short_by) lay_out(false);  // it saves no chunk
    }
    if (got < size && tail_taken && closing.bytes > c[k - 1].tail) {  // the closing edge instead of the tail
      pieces_[m - 1].size -= c[k - 1].tail;
      got -= c[k - 1].tail;
      tail_taken = false;
    }
    if (got < size && closing.bytes > 0 && !tail_taken) {
      // Without new chunks the edge closes the stitch; with them it follows them,
      // worth it only where it saves a chunk.
      const std::size_t left = size - got, edge = std::min(left, closing.bytes);
      const std::size_t fresh = round_up(left - edge, chunk_);
      if (fresh == 0 || (shortfall && fresh < round_up(left, chunk_))) {
        pieces_[m++] = {closing.addr, edge};
        plan.closing_edge = true;
        plan.pieces = m;
        plan.fresh = fresh;
        return true;
      }
    }
    plan.pieces = m;
    plan.fresh = got < size ? round_up(size - got, chunk_) : 0;
    return plan.fresh == 0 || (shortfall && m >= 1);
  }

  /// S3 (or S4 when plan.fresh > 0): builds the planned stitch, creating the new
  /// chunks first.
  void* stitch(const stitch_plan& plan, std::size_t size, std::size_t requested, std::uint32_t s) noexcept {
    std::size_t m = plan.pieces;
    if (plan.fresh > 0) {
      // New chunks for the rest, at the start of the best-fitting hole.
      std::uintptr_t fresh = 0;
      if (!large_.grow(plan.fresh, 0, fresh)) return nullptr;
      // The new bytes were a hole: they overlap no piece, whatever they merged with.
      detail::stitch_piece made{fresh, plan.fresh};
      if (plan.closing_edge) {
        // The closing edge follows the new bytes at their handle's end: growth may
        // have created more (min_growth), whose free rest then serves first.
        const std::uintptr_t end = large_.handle_end(made.end() - 1);
        const std::size_t extra = end - made.end();
        detail::stitch_piece edge = pieces_[m - 1];
        made.size = end - made.addr;
        pieces_[m - 1] = made;
        if (edge.size > extra) pieces_[m++] = {edge.addr, edge.size - extra};
      } else {
        pieces_[m++] = made;
      }
    }
    return build(std::span(pieces_.data(), m), size, requested, s,
                 plan.fresh ? fit_state::s4_shortfall : fit_state::s3_stitch);
  }

  /// Maps the pieces side by side into a new reservation and claims the prefix.
  void* build(std::span<const detail::stitch_piece> pieces, std::size_t size, std::size_t requested,
              std::uint32_t s, fit_state st) noexcept {
    std::size_t mapped = 0;
    for (const auto& p : pieces) mapped += span_bytes(p);
    auto* b = new (std::nothrow) stitch_block;
    if (b == nullptr) return nullptr;
    try {
      b->pieces.assign(pieces.begin(), pieces.end());
      b->claimed.assign(pieces.size(), nullptr);
    } catch (...) {
      delete b;
      return nullptr;
    }
    auto va = backend_.reserve(mapped);
    count(call::reserve);
    if (!va) {
      delete b;
      return nullptr;
    }
    std::size_t done = 0;
    errc failure = errc::ok;
    for (const auto& p : pieces) {
      large_.for_each_handle(p.addr, p.addr + p.size, [&](std::uintptr_t, std::size_t bytes, const auto& chunk) {
        if (failure != errc::ok) return;
        failure = backend_.map(va.value + done, bytes, chunk);
        count(call::map);
        if (failure == errc::ok) done += bytes;
      });
      if (failure != errc::ok) break;
    }
    if (failure == errc::ok) {
      failure = backend_.set_access(va.value, mapped);
      count(call::set_access);
    }
    if (failure != errc::ok) {  // roll back
      if (done > 0) (void)backend_.unmap(va.value, done);  // one call over every mapped handle
      count(call::unmap, done / chunk_);
      (void)backend_.address_free(va.value, mapped);
      count(call::address_free);
      delete b;
      return nullptr;
    }
    for (const auto& p : pieces) {
      large_.pin(p.addr, p.end(), 1);
      b->capacity += p.size;
    }
    b->va = va.value;
    b->mapped = mapped;
    b->pointer = va.value + (pieces.front().addr - large_.handle_floor(pieces.front().addr));
    by_pointer_.insert(*b);
    stats_.stitched_blocks.add(1);
    stats_.mapped_bytes.add(static_cast<std::int64_t>(mapped));
    if (!activate(*b, size, requested, s, st)) {
      // New chunks merged with a neighbour another stream still uses: give up on it.
      // If it cannot be unmapped now, cache it (as if freed): release_cached() retries.
      if (!unmap_stitch(*b, false)) cache(*b);
      return nullptr;
    }
    return reinterpret_cast<void*>(b->pointer);
  }

  /// Bytes of the handles that hold piece p (what a stitch maps for it).
  [[nodiscard]] std::size_t span_bytes(const detail::stitch_piece& p) const noexcept {
    return large_.handle_end(p.end() - 1) - large_.handle_floor(p.addr);
  }

  // ------------------------------------------------------------ free

  void deallocate_locked(std::uintptr_t p, std::size_t bytes, stream_type stream) noexcept {
    std::uint32_t s = 0;
    if (!streams_.index_of(stream, s)) {
      (void)streams_.wait_all();  // no room to tag it: make every stream's work done instead
    }
    for (arena_type* a : {&small_, &large_}) {
      if (!a->contains(p)) continue;
      range* r = a->starting_at(p);
      if (r == nullptr || r->state != detail::range_state::used || r->owner != nullptr) {
        invalid_free(r != nullptr && r->is_free() ? "double free" : "free of a pointer not allocated here", p);
        return;
      }
      if (bytes != 0 && bytes != r->requested) misuse("free with a size other than the one allocated", reinterpret_cast<void*>(p));
      on_freed(r->requested, r->size);
      a->release(*r, streams_.on_free(s));
      debug_check();
      return;
    }
    auto it = by_pointer_.find(p);
    if (it == by_pointer_.end() || !it->in_use) {
      invalid_free(it == by_pointer_.end() ? "free of a pointer not allocated here" : "double free", p);
      return;
    }
    stitch_block& b = *it;
    if (bytes != 0 && bytes != b.requested) misuse("free with a size other than the one allocated", reinterpret_cast<void*>(p));
    on_freed(b.requested, b.active);
    const detail::stream_tag tag = streams_.on_free(s);
    for (std::size_t i = 0; i < b.claimed_count; ++i) large_.release(*b.claimed[i], tag);
    b.claimed_count = 0;
    b.in_use = false;
    b.tag = tag;
    cache(b);
    evict_over_capacity();
    debug_check();
  }

  /// Puts an inactive stitched block into the sPool (by capacity) and at the LRU's end.
  void cache(stitch_block& b) noexcept {
    b.last_use = ++clock_;
    b.cached = true;
    cache_.insert(b);
    lru_.push_back(b);
    cached_bytes_ += b.mapped;
  }

  void invalid_free(const char* what, std::uintptr_t p) noexcept {
    ++stats_.invalid_frees;
    misuse(what, reinterpret_cast<void*>(p));
  }

  void on_freed(std::size_t requested, std::size_t size) noexcept {
    stats_.requested_bytes.sub(static_cast<std::int64_t>(requested));
    stats_.active_bytes.sub(static_cast<std::int64_t>(size));
    stats_.allocations.sub(1);
  }

  // ------------------------------------------------------------ eviction and release

  [[nodiscard]] stitch_cache_view cache_view() const noexcept {
    return {lru_.size(), cached_bytes_, static_cast<std::size_t>(stats_.mapped_bytes.current)};
  }

  void evict_over_capacity() noexcept {
    while (!lru_.empty() && evict_.over_capacity(cache_view())) {
      stitch_block& oldest = lru_.front();
      stitch_block& largest = *cache_.rbegin();
      stitch_block& victim = evict_.prefer_oldest({oldest.mapped, oldest.last_use}, {largest.mapped, largest.last_use})
                                 ? oldest
                                 : largest;
      if (!unmap_stitch(victim, false)) break;
      ++stats_.evictions;
    }
  }

  /// Unmaps a stitched block and frees its reservation, after its stream work is
  /// done. `force`: also a block in use (the allocator is going away).
  bool unmap_stitch(stitch_block& b, bool force) noexcept {
    if (capture_ && !force) return false;
    if (b.in_use && !force) return false;
    if (!b.in_use && !streams_.wait(b.tag) && !force) return false;  // force: going away, no retry
    if (backend_.unmap(b.va, b.mapped) != errc::ok) {
      count(call::unmap, b.mapped / chunk_);
      if (!force) return false;
    } else {
      count(call::unmap, b.mapped / chunk_);
    }
    (void)backend_.address_free(b.va, b.mapped);
    count(call::address_free);
    for (const auto& p : b.pieces) large_.pin(p.addr, p.end(), -1);
    if (b.cached) {
      cache_.erase(cache_.iterator_to(b));
      lru_.erase(lru_.iterator_to(b));
      cached_bytes_ -= b.mapped;
    }
    if (b.in_use) {
      for (std::size_t i = 0; i < b.claimed_count; ++i) b.claimed[i]->owner = nullptr;
    }
    by_pointer_.erase(by_pointer_.iterator_to(b));
    stats_.stitched_blocks.sub(1);
    stats_.mapped_bytes.sub(static_cast<std::int64_t>(b.mapped));
    delete &b;
    return true;
  }

  /// Releases the free whole chunks of arena `from` that no stitched block maps.
  void lend(arena_type& from) noexcept {
    if (capture_) return;
    if (from.free_count() == 0) return;
    (void)streams_.wait_all();
    from.coalesce_all();
    stats_.lent_bytes += from.release_free_chunks();
  }

  std::size_t release_cached_locked() noexcept {
    if (capture_) return 0;
    while (!lru_.empty())
      if (!unmap_stitch(lru_.front(), false)) break;
    (void)streams_.wait_all();
    small_.coalesce_all();
    large_.coalesce_all();
    const std::size_t released = small_.release_free_chunks() + large_.release_free_chunks();
    debug_check();
    return released;
  }

  // ------------------------------------------------------------ invariants

  bool check_locked() const noexcept {
    std::size_t reserved = 0, used = 0, live = 0;
    if (!small_.check(reserved, used, live) || !large_.check(reserved, used, live)) return false;
    if (static_cast<std::int64_t>(reserved) != stats_.reserved_bytes.current) return false;
    std::size_t stitch_mapped = 0, cached = 0, cached_bytes = 0;
    for (const stitch_block& b : by_pointer_) {
      stitch_mapped += b.mapped;
      if (b.in_use) {
        ++live;
        std::size_t sum = 0;
        for (std::size_t i = 0; i < b.claimed_count; ++i) {
          if (b.claimed[i]->owner != &b || b.claimed[i]->state != detail::range_state::used) return false;
          sum += b.claimed[i]->size;
        }
        if (sum != b.active || b.cached) return false;
      } else {
        if (!b.cached) return false;
        ++cached;
        cached_bytes += b.mapped;
      }
    }
    if (cached != lru_.size() || cached != cache_.size() || cached_bytes != cached_bytes_) return false;
    if (static_cast<std::int64_t>(used) != stats_.active_bytes.current) return false;
    if (static_cast<std::int64_t>(live) != stats_.allocations.current) return false;
    if (static_cast<std::int64_t>(reserved + stitch_mapped) != stats_.mapped_bytes.current) return false;
    if (static_cast<std::int64_t>(by_pointer_.size()) != stats_.stitched_blocks.current) return false;
    return true;
  }

  Backend backend_;
  options opt_;
  [[no_unique_address]] Stitch stitch_;
  [[no_unique_address]] Evict evict_;
  [[no_unique_address]] Fit fit_;
  std::size_t chunk_;
  statistics stats_;
  detail::node_pool<range> nodes_;
  detail::stream_table<Backend> streams_;
  arena_type small_;
  arena_type large_;
  std::uintptr_t large_base_ = 0;
  detail::stitch_by_pointer by_pointer_;
  detail::stitch_cache cache_;
  detail::stitch_lru lru_;
  std::size_t cached_bytes_ = 0;
  bool capture_ = false;  ///< set_capture_mode
  std::uint64_t clock_ = 0;
  std::array<stitch_candidate, max_candidates> candidates_{};
  std::array<detail::stitch_piece, max_candidates + 3> pieces_{};  // + opening edge, new chunks, closing edge
  mutable std::mutex mutex_;
};

} // namespace gmlake
