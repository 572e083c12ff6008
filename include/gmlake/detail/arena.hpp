// gmlake/detail/arena.hpp - one virtual address range, tiled by ranges, with
// physical chunks mapped under every byte that is not a hole.
//
// The arena is where physical memory lives: each chunk is mapped exactly once
// here, at its slot, and stays mapped until it is released. Free and used ranges
// are placed at 512-byte granularity inside and across chunks (split and
// coalesce, as a best-fit caching allocator does). Stitched blocks elsewhere map
// the same chunks again; a slot's `stitch_refs` counts those mappings, and a chunk
// with any is never released.
//
// All member functions are noexcept. Those that can fail say so by value and
// leave the arena as it was. Pre for every mutation: the caller holds the
// allocator's lock and has reserved the nodes it asks for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../concepts.hpp"
#include "../stats.hpp"
#include "node_pool.hpp"
#include "range.hpp"
#include "stream_table.hpp"

namespace gmlake::detail {

template <PhysicalBackend Backend>
class arena {
 public:
  using chunk_type = typename Backend::chunk_type;

  /// One chunk-sized slot of the arena. A physical handle covers `count` slots
  /// from `first` (growth may create handles larger than a chunk, up to the
  /// arena's max_handle); its chunk_type is kept in its first slot. Handles are
  /// mapped, stitched and released whole (cuMemMap maps a handle whole).
  struct slot {
    chunk_type chunk{};
    std::uint32_t stitch_refs = 0;  ///< stitched blocks mapping this slot's handle
    std::uint32_t first = 0;        ///< index of the handle's first slot
    std::uint32_t count = 0;        ///< slots in the handle
    bool mapped = false;
  };

  /// Where growth may add the missing bytes next to a free range.
  struct extension {
    range* neighbour = nullptr;  ///< the free range that grows
    range* hole = nullptr;       ///< the hole beside it that gives the address space
    std::size_t bytes = 0;       ///< new chunk bytes
    bool after = true;           ///< new chunks after `neighbour` (else before)
  };

  /// `max_handle`: the largest physical handle growth creates (a multiple of
  /// `chunk`; 0 or `chunk`: one handle per chunk).
  arena(Backend& backend, node_pool<range>& nodes, stream_table<Backend>& streams, statistics& stats,
        std::size_t chunk, std::size_t max_handle = 0) noexcept
      : backend_(backend),
        nodes_(nodes),
        streams_(streams),
        stats_(stats),
        chunk_(chunk),
        max_handle_(max_handle > chunk ? max_handle / chunk * chunk : chunk) {}
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;

  /// Reserves `va_bytes` of address space, all one hole.
  [[nodiscard]] errc open(std::size_t va_bytes) noexcept {
    va_bytes = round_up(va_bytes, chunk_);
    if (!nodes_.reserve(1)) return errc::out_of_memory;
    auto va = backend_.reserve(va_bytes);
    count(call::reserve);
    if (!va) return va.error;
    base_ = va.value;
    size_ = va_bytes;
    range* h = nodes_.take();
    h->addr = base_;
    h->size = size_;
    h->state = range_state::hole;
    address_.insert(*h);
    holes_.insert(*h);
    return errc::ok;
  }

  /// Unmaps and releases every chunk and gives the address space back. Pre: no
  /// stitched block maps any chunk. Live ranges are dropped (their memory goes).
  void close() noexcept {
    if (size_ == 0) return;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].mapped || slots_[i].first != i) continue;
      const std::size_t n = slots_[i].count;
      (void)backend_.unmap(base_ + i * chunk_, n * chunk_);
      count(call::unmap);
      (void)backend_.release(slots_[i].chunk);
      count(call::release);
      for (std::size_t j = 0; j < n; ++j) forget_chunk(slots_[i + j]);
    }
    free_.clear();
    holes_.clear();
    address_.clear_and_dispose([this](range* r) { nodes_.give(r); });
    (void)backend_.address_free(base_, size_);
    count(call::address_free);
    size_ = 0;
  }

  // ------------------------------------------------------------ lookup

  [[nodiscard]] bool contains(std::uintptr_t p) const noexcept { return p - base_ < size_; }
  [[nodiscard]] std::size_t chunk_size() const noexcept { return chunk_; }
  [[nodiscard]] std::uintptr_t base() const noexcept { return base_; }
  [[nodiscard]] const free_index& free_ranges() const noexcept { return free_; }
  [[nodiscard]] std::size_t free_count() const noexcept { return free_.size(); }

  /// The range that starts at p, or nullptr.
  [[nodiscard]] range* starting_at(std::uintptr_t p) noexcept {
    auto it = address_.find(p);
    return it == address_.end() ? nullptr : &*it;
  }
  /// The range that holds byte p. Pre: contains(p).
  [[nodiscard]] range& holding(std::uintptr_t p) noexcept {
    auto it = address_.upper_bound(p);
    return *--it;
  }
  [[nodiscard]] slot& slot_of(std::uintptr_t p) noexcept { return slots_[(p - base_) / chunk_]; }
  [[nodiscard]] std::size_t max_handle() const noexcept { return max_handle_; }
  /// Growth creates at least `bytes` where the hole allows (0: what is needed), and at
  /// least reserved / divisor (divisor 0: no such term), capped at `cap` (rounded down
  /// to the chunk). If the surplus cannot be created, growth creates what is needed.
  void set_min_growth(std::size_t bytes, std::size_t divisor = 0, std::size_t cap = ~std::size_t{0}) noexcept {
    min_growth_ = round_up(bytes, chunk_);
    cap = round_down(cap, chunk_);
    growth_divisor_ = divisor;
    growth_cap_ = cap;
  }
  /// The fewest bytes growth creates now.
  [[nodiscard]] std::size_t min_growth() const noexcept {
    std::size_t g = min_growth_;
    if (growth_divisor_ != 0)
      g = std::max(g, round_down(static_cast<std::size_t>(stats_.reserved_bytes.current) / growth_divisor_, chunk_));
    return std::min(g, growth_cap_);
  }
  /// A growth of at least `growth` bytes creates handles of up to `handle` bytes (0: off).
  void set_big_growth(std::size_t growth, std::size_t handle) noexcept {
    big_growth_ = growth;
    big_handle_ = round_up(handle, chunk_);
  }

  /// Start and end of the handle that holds byte p. Pre: p's chunk is mapped.
  [[nodiscard]] std::uintptr_t handle_floor(std::uintptr_t p) const noexcept {
    return base_ + slots_[(p - base_) / chunk_].first * chunk_;
  }
  [[nodiscard]] std::uintptr_t handle_end(std::uintptr_t p) const noexcept {
    const slot& h = slots_[slots_[(p - base_) / chunk_].first];
    return base_ + (h.first + h.count) * chunk_;
  }
  [[nodiscard]] const chunk_type& handle_chunk(std::uintptr_t p) const noexcept {
    return slots_[slots_[(p - base_) / chunk_].first].chunk;
  }
  /// Calls f(addr, bytes, chunk) for each handle holding a byte of [lo, hi), in order.
  template <class F>
  void for_each_handle(std::uintptr_t lo, std::uintptr_t hi, F&& f) const noexcept {
    for (std::uintptr_t a = handle_floor(lo); a < hi;) {
      const std::uintptr_t e = handle_end(a);
      f(a, e - a, handle_chunk(a));
      a = e;
    }
  }
  /// Adds d to the stitch_refs of every slot of the handles holding [lo, hi).
  void pin(std::uintptr_t lo, std::uintptr_t hi, int d) noexcept {
    for (std::uintptr_t a = handle_floor(lo), e = handle_end(hi - 1); a < e; a += chunk_)
      slot_of(a).stitch_refs += static_cast<std::uint32_t>(d);
  }

  /// Bytes of whole handles inside r (what a stitch can map as a middle piece), and
  /// the bytes before and after them.
  struct chunk_split {
    std::size_t head, whole, tail;
  };
  [[nodiscard]] chunk_split split_of(const range& r) const noexcept {
    std::uintptr_t lo = base_ + round_up(r.addr - base_, chunk_);
    std::uintptr_t hi = base_ + round_down(r.end() - base_, chunk_);
    if (hi <= lo) return {r.size, 0, 0};
    if (handle_floor(lo) != lo) lo = handle_end(lo);
    if (hi > lo && handle_end(hi - 1) != hi) hi = handle_floor(hi - 1);
    if (hi <= lo) return {r.size, 0, 0};
    return {lo - r.addr, hi - lo, r.end() - hi};
  }

  // ------------------------------------------------------------ placing

  /// Marks [addr, addr+size) of the free range f used; the bytes around it stay
  /// free. Needs 2 nodes. Returns the used range.
  range& carve(range& f, std::uintptr_t addr, std::size_t size) noexcept {
    GMLAKE_ASSERT(f.is_free() && addr >= f.addr && addr + size <= f.end(), "carve outside a free range");
    free_.erase(free_.iterator_to(f));
    const std::uintptr_t f_addr = f.addr, f_end = f.end();
    f.addr = addr;
    f.size = size;
    f.state = range_state::used;
    if (addr > f_addr) {
      range* before = make(f_addr, addr - f_addr, range_state::free, f.segment, f.tag);
      address_.insert_before(address_.iterator_to(f), *before);
      free_.insert(*before);
    }
    if (addr + size < f_end) {
      range* after = make(addr + size, f_end - (addr + size), range_state::free, f.segment, f.tag);
      address_.insert_before(std::next(address_.iterator_to(f)), *after);
      free_.insert(*after);
    }
    return f;
  }

  /// Frees the used range u with tag t and coalesces it with its free neighbours
  /// of the same segment where the stream rules allow. Returns the free range.
  range& release(range& u, stream_tag t) noexcept {
    u.state = range_state::free;
    u.tag = t;
    u.owner = nullptr;
    u.requested = 0;
    return settle(u);
  }

  // ------------------------------------------------------------ growth

  /// Finds where `size` bytes fit by growing a free range (usable by the caller)
  /// into the hole beside it: the largest such free range, so the fewest new bytes.
  template <class Usable>
  [[nodiscard]] bool find_extension(std::size_t size, const Usable& usable, extension& out) noexcept {
    bool found = false;
    for (range& h : holes_) {
      auto it = address_.iterator_to(h);
      if (it != address_.begin()) {
        range& f = *std::prev(it);
        consider(f, h, true, size, usable, found, out);
      }
      if (auto next = std::next(it); next != address_.end()) consider(*next, h, false, size, usable, found, out);
    }
    return found;
  }

  /// Maps new chunks as e says. Needs 2 nodes. Returns the free range that now
  /// holds the neighbour and the new bytes.
  [[nodiscard]] result<range*> extend(const extension& e) noexcept {
    const std::size_t bytes = std::max(e.bytes, std::min(min_growth(), e.hole->size));
    const std::uintptr_t at = e.after ? e.hole->addr : e.hole->end() - bytes;
    auto r = populate(*e.hole, at, bytes, e.neighbour->segment);
    if (r || bytes == e.bytes) return r;
    // The surplus did not fit (the backend is nearly full): create only what is needed.
    return populate(*e.hole, e.after ? e.hole->addr : e.hole->end() - e.bytes, e.bytes, e.neighbour->segment);
  }

  /// Maps `bytes` of new chunks at the start of the smallest hole that holds them,
  /// as a free range of `segment`; `fresh` gets their address. Needs 2 nodes.
  /// Returns the free range holding them (merged with free neighbours).
  [[nodiscard]] result<range*> grow(std::size_t bytes, std::uint32_t segment, std::uintptr_t& fresh) noexcept {
    auto it = holes_.lower_bound(size_key{bytes}, size_key_less{});
    if (it == holes_.end()) return errc::out_of_memory;  // address space exhausted
    const std::size_t want = std::max(bytes, std::min(min_growth(), it->size));
    fresh = it->addr;
    auto r = populate(*it, it->addr, want, segment);
    if (r || want == bytes) return r;
    return populate(*it, it->addr, bytes, segment);  // the surplus did not fit: only what is needed
  }

  /// Unmaps and releases every chunk wholly inside a free range whose stream work is
  /// known done and that no stitched block maps. Returns the bytes released.
  std::size_t release_free_chunks() noexcept {
    std::size_t released = 0;
    for (auto it = address_.begin(); it != address_.end();) {
      range& r = *it;
      ++it;
      if (!r.is_free() || !streams_.known_done(r.tag)) continue;
      released += release_chunks_in(r, it);
    }
    return released;
  }

  /// Unmaps and releases one unpinned whole handle of at least `bytes` inside a free
  /// range whose stream work is known done: the smallest such handle in the `scan`
  /// largest free ranges. Returns the bytes released (0: none).
  std::size_t release_one_handle(std::size_t bytes, std::size_t scan) noexcept {
    range* best = nullptr;
    std::uintptr_t best_a = 0, best_e = 0;
    for (auto it = free_.rbegin(); it != free_.rend() && it->size >= bytes && scan > 0; ++it, --scan) {
      range& r = const_cast<range&>(*it);
      if (!streams_.known_done(r.tag)) continue;
      const auto sp = split_of(r);
      for (std::uintptr_t a = r.addr + sp.head, hi = a + sp.whole; a < hi;) {
        const std::uintptr_t e = handle_end(a);
        if (e - a >= bytes && slot_of(a).stitch_refs == 0 && (best == nullptr || e - a < best_e - best_a)) {
          best = &r;
          best_a = a;
          best_e = e;
        }
        a = e;
      }
    }
    if (best == nullptr || !nodes_.reserve(2)) return 0;
    if (backend_.unmap(best_a, best_e - best_a) != errc::ok) {
      count(call::unmap);
      return 0;
    }
    count(call::unmap);
    (void)backend_.release(slot_of(best_a).chunk);
    count(call::release);
    for (std::uintptr_t c = best_a; c < best_e; c += chunk_) forget_chunk(slot_of(c));
    (void)carve_hole(*best, best_a, best_e);
    return best_e - best_a;
  }

  /// Coalesces every pair of adjacent free ranges the stream rules now allow.
  void coalesce_all() noexcept {
    for (auto it = address_.begin(); it != address_.end();) {
      range& r = *it;
      if (!r.is_free()) {
        ++it;
        continue;
      }
      free_.erase(free_.iterator_to(r));
      range& s = settle(r);
      it = std::next(address_.iterator_to(s));
    }
  }

  [[nodiscard]] std::uint32_t new_segment() noexcept { return ++segments_; }

  /// Where the arena's bytes are: chunk bytes held, used, free in whole chunks
  /// (stitchable), free in partial chunks (heads and tails), free but still
  /// pending on another stream. O(ranges).
  struct tally_type {
    std::size_t reserved = 0, used = 0, free_whole = 0, free_partial = 0, free_pending = 0;
  };
  [[nodiscard]] tally_type tally() const noexcept {
    tally_type t;
    for (const range& r : address_) {
      if (r.state == range_state::hole) continue;
      if (!r.is_free()) {
        t.used += r.size;
        continue;
      }
      if (!streams_.known_done(r.tag)) t.free_pending += r.size;
      const auto sp = split_of(r);
      t.free_whole += sp.whole;
      t.free_partial += sp.head + sp.tail;
    }
    for (const slot& s : slots_)
      if (s.mapped) t.reserved += chunk_;
    return t;
  }


  /// Calls on_handle(addr, bytes) for each mapped handle in address order, then
  /// on_piece(range) for each range within it, clipped to the handle (a range may
  /// span handles); the pieces tile the handle.
  template <class OnHandle, class OnPiece>
  void visit_handles(OnHandle&& on_handle, OnPiece&& on_piece) const {
    if (size_ == 0) return;
    auto it = address_.begin();
    for (std::size_t i = 0; i < slots_.size(); i += slots_[i].count ? slots_[i].count : 1) {
      if (!slots_[i].mapped || slots_[i].first != i) continue;
      const std::uintptr_t lo = base_ + i * chunk_, hi = lo + slots_[i].count * chunk_;
      on_handle(lo, hi - lo);
      while (it != address_.end() && it->end() <= lo) ++it;
      for (auto r = it; r != address_.end() && r->addr < hi; ++r) {
        range piece = *r;
        piece.addr = std::max(r->addr, lo);
        piece.size = std::min(r->end(), hi) - piece.addr;
        on_piece(static_cast<const range&>(piece));
      }
    }
  }

  /// Every stated property of the tiling, the indexes and the slots.
  [[nodiscard]] bool check(std::size_t& reserved, std::size_t& used, std::size_t& live) const noexcept {
    if (size_ == 0) return true;
    std::uintptr_t at = base_;
    std::size_t nfree = 0, nholes = 0;
    const range* prev = nullptr;
    for (const range& r : address_) {
      if (r.addr != at || r.size == 0) return false;
      at = r.end();
      if (r.addr % block_alignment != 0 || r.size % block_alignment != 0) return false;
      if (r.state == range_state::hole) {
        ++nholes;
        if ((r.addr - base_) % chunk_ != 0 || r.size % chunk_ != 0) return false;
        if (prev && prev->state == range_state::hole) return false;  // holes coalesce always
        for (std::uintptr_t c = r.addr; c < r.end(); c += chunk_) {
          const std::size_t i = (c - base_) / chunk_;
          if (i < slots_.size() && slots_[i].mapped) return false;
        }
      } else {
        for (std::uintptr_t c = round_down(r.addr - base_, chunk_) + base_; c < r.end(); c += chunk_) {
          const std::size_t i = (c - base_) / chunk_;
          if (i >= slots_.size() || !slots_[i].mapped) return false;
        }
        if (r.is_free()) {
          ++nfree;
          // Coalescing across streams is best effort (two ranges freed on different
          // streams stay apart until release_cached), so adjacency is not checked.
          if (prev && prev->is_free() && prev->tag.seq == 0 && r.tag.seq == 0 && prev->segment == r.segment)
            return false;  // two clean ranges of one segment always coalesce
        } else {
          used += r.size;
          if (r.owner == nullptr) ++live;
        }
      }
      prev = &r;
    }
    if (at != base_ + size_ || nfree != free_.size() || nholes != holes_.size()) return false;
    for (const range& r : free_)
      if (!r.is_free()) return false;
    for (const range& r : holes_)
      if (r.state != range_state::hole) return false;
    for (const slot& s : slots_)
      if (s.mapped) reserved += chunk_;
    return true;
  }

 private:
  void count(call c) noexcept { ++stats_.calls[static_cast<std::size_t>(c)]; }

  range* make(std::uintptr_t addr, std::size_t size, range_state st, std::uint32_t seg, stream_tag t) noexcept {
    range* r = nodes_.take();
    r->addr = addr;
    r->size = size;
    r->state = st;
    r->segment = seg;
    r->tag = t;
    return r;
  }

  /// r is free and in no index but the address one: merge it with its neighbours
  /// where allowed, then index it.
  range& settle(range& r) noexcept {
    auto it = address_.iterator_to(r);
    if (it != address_.begin()) {
      range& p = *std::prev(it);
      stream_tag t;
      if (p.is_free() && p.segment == r.segment && streams_.merge(p.tag, r.tag, t)) {
        free_.erase(free_.iterator_to(p));
        address_.erase(address_.iterator_to(p));
        r.addr = p.addr;
        r.size += p.size;
        r.tag = t;
        nodes_.give(&p);
      }
    }
    if (auto next = std::next(address_.iterator_to(r)); next != address_.end()) {
      range& n = *next;
      stream_tag t;
      if (n.is_free() && n.segment == r.segment && streams_.merge(r.tag, n.tag, t)) {
        free_.erase(free_.iterator_to(n));
        address_.erase(next);
        r.size += n.size;
        r.tag = t;
        nodes_.give(&n);
      }
    }
    free_.insert(r);
    return r;
  }

  template <class Usable>
  void consider(range& f, range& h, bool after, std::size_t size, const Usable& usable, bool& found,
                extension& out) noexcept {
    if (!f.is_free() || f.size >= size || !usable(f)) return;
    const std::size_t bytes = round_up(size - f.size, chunk_);
    if (bytes > h.size) return;
    if (!found || f.size > out.neighbour->size) {
      out = {&f, &h, bytes, after};
      found = true;
    }
  }

  /// Creates and maps bytes/chunk chunks at [at, at+bytes) inside hole h, makes
  /// them accessible, and turns that part of h into a free range. On failure undoes
  /// every step and leaves h as it was.
  result<range*> populate(range& h, std::uintptr_t at, std::size_t bytes, std::uint32_t segment) noexcept {
    GMLAKE_ASSERT(h.state == range_state::hole && at >= h.addr && at + bytes <= h.end(), "populate outside a hole");
    const std::size_t first = (at - base_) / chunk_, n = bytes / chunk_;
    if (first + n > slots_.size()) {
      try {
        slots_.resize(std::max(first + n, slots_.size() + slots_.size() / 2));
      } catch (...) {
        return errc::out_of_memory;
      }
    }
    // Handles of up to max_handle_ bytes each, the first ones largest.
    std::size_t per = max_handle_ / chunk_;
    if (big_growth_ != 0 && bytes >= big_growth_) per = std::max(per, big_handle_ / chunk_);
    std::size_t created = 0, mapped = 0;  // slots covered by created / mapped handles
    errc failure = errc::ok;
    while (created < n) {
      const std::size_t k = std::min(per, n - created);
      auto c = backend_.create(k * chunk_);
      count(call::create);
      if (!c) {
        failure = c.error;
        break;
      }
      slot& h = slots_[first + created];
      h.chunk = c.value;
      for (std::size_t j = 0; j < k; ++j) {
        slots_[first + created + j].first = static_cast<std::uint32_t>(first + created);
        slots_[first + created + j].count = static_cast<std::uint32_t>(k);
      }
      created += k;
    }
    if (failure == errc::ok) {
      while (mapped < n) {
        const slot& h = slots_[first + mapped];
        const errc e = backend_.map(at + mapped * chunk_, h.count * chunk_, h.chunk);
        count(call::map);
        if (e != errc::ok) {
          failure = e;
          break;
        }
        mapped += h.count;
      }
    }
    if (failure == errc::ok) {
      failure = backend_.set_access(at, bytes);
      count(call::set_access);
    }
    if (failure != errc::ok) {  // roll back, in reverse
      for (std::size_t i = 0; i < mapped; i += slots_[first + i].count) {
        (void)backend_.unmap(at + i * chunk_, slots_[first + i].count * chunk_);
        count(call::unmap);
      }
      for (std::size_t i = 0; i < created; i += slots_[first + i].count) {
        (void)backend_.release(slots_[first + i].chunk);
        count(call::release);
      }
      for (std::size_t i = 0; i < created; ++i) slots_[first + i] = slot{};
      return failure;
    }
    for (std::size_t i = 0; i < n; ++i) {
      slots_[first + i].mapped = true;
      slots_[first + i].stitch_refs = 0;
    }
    stats_.chunks.add(static_cast<std::int64_t>(n));
    stats_.reserved_bytes.add(static_cast<std::int64_t>(bytes));
    stats_.mapped_bytes.add(static_cast<std::int64_t>(bytes));

    // Split the hole: the new range takes its start or its end.
    holes_.erase(holes_.iterator_to(h));
    range* fresh = make(at, bytes, range_state::used, segment, stream_tag{});
    if (bytes == h.size) {
      address_.insert_before(address_.iterator_to(h), *fresh);
      address_.erase(address_.iterator_to(h));
      nodes_.give(&h);
    } else if (at == h.addr) {
      h.addr += bytes;
      h.size -= bytes;
      address_.insert_before(address_.iterator_to(h), *fresh);
      holes_.insert(h);
    } else {
      h.size -= bytes;
      address_.insert_before(std::next(address_.iterator_to(h)), *fresh);
      holes_.insert(h);
    }
    return &release(*fresh, stream_tag{});
  }

  /// Releases the runs of unpinned whole chunks inside free range r; `next` is
  /// the iterator the caller continues from (kept valid).
  std::size_t release_chunks_in(range& r, typename address_index::iterator& next) noexcept {
    std::size_t released = 0;
    range* cur = &r;
    while (true) {
      const auto sp = split_of(*cur);
      if (sp.whole == 0) break;
      std::uintptr_t a = cur->addr + sp.head;
      const std::uintptr_t hi = a + sp.whole;
      // split_of gives whole handles: skip pinned ones, release a run of unpinned ones.
      while (a < hi && slot_of(a).stitch_refs != 0) a = handle_end(a);
      if (a >= hi) break;
      std::uintptr_t b = a;
      while (b < hi && slot_of(b).stitch_refs == 0) b = handle_end(b);
      if (!nodes_.reserve(2)) break;
      if (backend_.unmap(a, b - a) != errc::ok) {
        count(call::unmap);
        break;
      }
      count(call::unmap);
      for (std::uintptr_t c = a; c < b;) {
        const std::uintptr_t e = handle_end(c);
        (void)backend_.release(slot_of(c).chunk);
        count(call::release);
        for (; c < e; c += chunk_) forget_chunk(slot_of(c));
      }
      released += b - a;
      // [cur.addr, a) stays free, [a, b) becomes a hole, [b, cur.end) stays free.
      cur = carve_hole(*cur, a, b);
      if (cur->state == range_state::hole) break;
    }
    // The caller's iterator may point at a node merged away: continue after cur.
    next = std::next(address_.iterator_to(*cur));
    return released;
  }

  void forget_chunk(slot& s) noexcept {
    s = slot{};
    stats_.chunks.sub(1);
    stats_.reserved_bytes.sub(static_cast<std::int64_t>(chunk_));
    stats_.mapped_bytes.sub(static_cast<std::int64_t>(chunk_));
  }

  /// Turns [a, b) of free range f into a hole (merged with hole neighbours).
  /// Returns the free range after it, or the hole if nothing follows. Needs 2 nodes.
  range* carve_hole(range& f, std::uintptr_t a, std::uintptr_t b) noexcept {
    range& mid = carve(f, a, b - a);
    mid.state = range_state::hole;
    mid.segment = 0;
    mid.tag = {};
    range* after = nullptr;
    auto it = address_.iterator_to(mid);
    if (auto n = std::next(it); n != address_.end() && n->is_free() && n->addr == b) after = &*n;
    // merge with neighbouring holes
    if (it != address_.begin()) {
      range& p = *std::prev(it);
      if (p.state == range_state::hole) {
        holes_.erase(holes_.iterator_to(p));
        address_.erase(address_.iterator_to(p));
        mid.addr = p.addr;
        mid.size += p.size;
        nodes_.give(&p);
      }
    }
    if (auto n = std::next(address_.iterator_to(mid)); n != address_.end() && n->state == range_state::hole) {
      range& q = *n;
      holes_.erase(holes_.iterator_to(q));
      address_.erase(n);
      mid.size += q.size;
      nodes_.give(&q);
    }
    holes_.insert(mid);
    return after ? after : &mid;
  }

  Backend& backend_;
  node_pool<range>& nodes_;
  stream_table<Backend>& streams_;
  statistics& stats_;
  std::size_t chunk_;
  std::size_t max_handle_;
  std::size_t min_growth_ = 0;
  std::size_t growth_divisor_ = 0;
  std::size_t growth_cap_ = ~std::size_t{0};
  std::size_t big_growth_ = 0, big_handle_ = 0;
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  std::uint32_t segments_ = 0;
  address_index address_;
  free_index free_;
  free_index holes_;
  std::vector<slot> slots_;
};

} // namespace gmlake::detail
