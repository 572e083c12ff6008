// gmlake/detail/arena.hpp - one virtual address range, tiled by ranges, with
// physical chunks mapped under every byte that is not a hole.
//
// The arena is where physical memory lives: each chunk (a physical handle) is
// mapped exactly once here and stays mapped until it is released. The address
// range is cut into slots of the allocator's chunk_size(); a chunk covers one or
// more whole slots. Free and used ranges are placed at 512-byte granularity inside
// and across chunks (split and coalesce, as a best-fit caching allocator does).
// Stitched blocks elsewhere map the same chunks again; a slot's `stitch_refs`
// counts those mappings, and a chunk with any is never released.
//
// How growth cuts new bytes into chunks, and how many bytes it creates, is decided
// above (a growth_plan); the arena carries it out. It keeps its part of the
// footprint (chunks, reserved and mapped bytes); the backend it is given counts
// the calls.
//
// A chunk whose undo fails (an unmap or a release during a rollback or a release
// of free chunks) is not forgotten: its slots keep the chunk with what is still to
// be done (`pending`), and its address space becomes a quarantined range, never
// handed out while the backend may still map it. retry_quarantine() (on the next
// growth, on release_cached()) and close() retry the undo.
//
// The large arena lends the small one whole free chunks (borrow()): the chunk stays
// mapped in its own arena as a `lent` range and is mapped a second time in the
// borrower, with no new physical memory; the borrower gives it back (unmaps it there)
// once it is free again. A borrowed chunk is never released by the borrower and is
// not in its reserved bytes.
//
// All member functions are noexcept. Those that can fail say so by value and
// leave the arena as it was (apart from a quarantine). Pre for every mutation: the caller holds the
// allocator's lock and has reserved the nodes it asks for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../concepts.hpp"
#include "footprint.hpp"
#include "node_pool.hpp"
#include "range.hpp"
#include "stitch_planner.hpp"
#include "stream_table.hpp"

namespace gmlake::detail {

template <PhysicalBackend Backend>
class arena {
 public:
  using chunk_type = typename Backend::chunk_type;

  /// One slot of the arena (chunk_size() bytes). A chunk covers `count` slots from
  /// `first` (growth may create chunks of several slots, as its growth_plan says);
  /// its chunk_type is kept in its first slot. Chunks are mapped, stitched and
  /// released whole (cuMemMap maps a handle whole).
  struct slot {
    chunk_type chunk{};
    std::uint32_t stitch_refs = 0;  ///< stitched blocks mapping this slot's chunk
    std::uint32_t first = 0;        ///< index of the chunk's first slot
    std::uint32_t count = 0;        ///< slots in the chunk
    bool mapped = false;
    bool borrowed = false;  ///< the lender's chunk, mapped here too (first slot: `home`)
    /// Quarantined: what is left to undo of the chunk (it is not mapped for use):
    /// 1 unmap then release, 2 release, 3 unmap then give back (borrowed). 0: nothing.
    std::uint8_t pending = 0;
    std::uintptr_t home = 0;  ///< borrowed: the chunk's address in the lender
  };

  /// A whole chunk lent to the other arena: its handle, its bytes, and its address
  /// here, where it stays mapped (the key that gives it back: take_back()).
  struct loan {
    chunk_type chunk{};
    std::uintptr_t home = 0;
    std::size_t bytes = 0;
  };

  /// Where growth may add the missing bytes next to a free range.
  struct extension {
    range* neighbour = nullptr;  ///< the free range that grows
    range* hole = nullptr;       ///< the hole beside it that gives the address space
    std::size_t bytes = 0;       ///< new chunk bytes
    bool after = true;           ///< new chunks after `neighbour` (else before)
  };

  /// `slot`: the bytes of one slot (the smallest chunk).
  arena(Backend& backend, node_pool<range>& nodes, stream_table<Backend>& streams, footprint& held,
        std::size_t slot) noexcept
      : backend_(backend), nodes_(nodes), streams_(streams), held_(held), slot_(slot) {}
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;

  /// The arena borrow() takes chunks from (it must outlive this one's chunks: close
  /// this one first).
  void borrow_from(arena& lender) noexcept { lender_ = &lender; }

  /// Reserves `va_bytes` of address space, all one hole.
  [[nodiscard]] errc open(std::size_t va_bytes) noexcept {
    va_bytes = round_up(va_bytes, slot_);
    if (!nodes_.reserve(1)) return errc::out_of_memory;
    auto va = backend_.reserve(va_bytes);
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
    // Nothing can retry after this: each call is retried a few times in a row.
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      slot& c = slots_[i];
      if ((!c.mapped && c.pending == 0) || c.first != i) continue;
      const std::size_t n = c.count;
      const std::uintptr_t at = base_ + i * slot_;
      if (c.mapped || c.pending == 1 || c.pending == 3) (void)retry([&] { return backend_.unmap(at, n * slot_); });
      if (c.borrowed || c.pending == 3) {  // the lender releases it
        if (c.pending == 3) held_.quarantined.sub(static_cast<std::int64_t>(n * slot_));
        else held_.mapped.sub(static_cast<std::int64_t>(n * slot_));
        for (std::size_t j = 0; j < n; ++j) slots_[i + j] = slot{};
        continue;
      }
      (void)retry([&] { return backend_.release(c.chunk); });
      if (c.mapped) {
        held_.chunks.sub(1);
        for (std::size_t j = 0; j < n; ++j) forget_slot(slots_[i + j]);
      } else {
        held_.quarantined.sub(static_cast<std::int64_t>(n * slot_));
        for (std::size_t j = 0; j < n; ++j) slots_[i + j] = slot{};
      }
    }
    free_.clear();
    holes_.clear();
    address_.clear_and_dispose([this](range* r) { nodes_.give(r); });
    quarantined_ranges_ = 0;
    borrowed_ = owed_ = lent_ = 0;
    (void)retry([&] { return backend_.address_free(base_, size_); });
    size_ = 0;
  }

  // ------------------------------------------------------------ lookup

  [[nodiscard]] bool contains(std::uintptr_t p) const noexcept { return p - base_ < size_; }
  /// Capture mode: no unmap or release until it is off. A growth that fails then
  /// leaves its chunks quarantined, undone by the next retry_quarantine().
  void set_hold(bool on) noexcept { hold_ = on; }
  /// The start of the arena's address space (its first slot).
  [[nodiscard]] std::uintptr_t base() const noexcept { return base_; }
  [[nodiscard]] std::size_t free_count() const noexcept { return free_.size(); }
  /// Physical bytes of the chunks this arena holds (tally().reserved, kept as it changes).
  [[nodiscard]] std::size_t reserved() const noexcept { return reserved_; }
  /// Bytes of the chunks borrowed from the lender / lent to the other arena.
  [[nodiscard]] std::size_t borrowed() const noexcept { return borrowed_; }
  [[nodiscard]] std::size_t lent() const noexcept { return lent_; }
  /// Bytes of borrowed chunks quarantined (unmapped here, not yet given back).
  [[nodiscard]] std::size_t owed() const noexcept { return owed_; }

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
  [[nodiscard]] slot& slot_of(std::uintptr_t p) noexcept { return slots_[(p - base_) / slot_]; }
  /// Start and end of the chunk that holds byte p. Pre: p's slot is mapped.
  [[nodiscard]] std::uintptr_t chunk_floor(std::uintptr_t p) const noexcept {
    return base_ + slots_[(p - base_) / slot_].first * slot_;
  }
  [[nodiscard]] std::uintptr_t chunk_end(std::uintptr_t p) const noexcept {
    const slot& h = slots_[slots_[(p - base_) / slot_].first];
    return base_ + (h.first + h.count) * slot_;
  }
  [[nodiscard]] const chunk_type& chunk_of(std::uintptr_t p) const noexcept {
    return slots_[slots_[(p - base_) / slot_].first].chunk;
  }
  /// Calls f(addr, bytes, chunk) for each chunk holding a byte of [lo, hi), in order.
  template <class F>
  void for_each_chunk(std::uintptr_t lo, std::uintptr_t hi, F&& f) const noexcept {
    for (std::uintptr_t a = chunk_floor(lo); a < hi;) {
      const std::uintptr_t e = chunk_end(a);
      f(a, e - a, chunk_of(a));
      a = e;
    }
  }
  /// Calls f(i) for the index of every slot of the chunks holding [lo, hi).
  template <class F>
  void for_each_slot(std::uintptr_t lo, std::uintptr_t hi, F&& f) const noexcept {
    for (std::uintptr_t a = chunk_floor(lo), e = chunk_end(hi - 1); a < e; a += slot_) f((a - base_) / slot_);
  }
  [[nodiscard]] std::size_t slot_count() const noexcept { return slots_.size(); }
  /// Adds d to the stitch_refs of every slot of the chunks holding [lo, hi).
  void pin(std::uintptr_t lo, std::uintptr_t hi, int d) noexcept {
    for (std::uintptr_t a = chunk_floor(lo), e = chunk_end(hi - 1); a < e; a += slot_)
      slot_of(a).stitch_refs += static_cast<std::uint32_t>(d);
  }

  /// Bytes of whole chunks inside r (what a stitch can map as a middle piece), and
  /// the bytes before and after them.
  struct chunk_split {
    std::size_t head, whole, tail;
  };
  [[nodiscard]] chunk_split split_of(const range& r) const noexcept {
    std::uintptr_t lo = base_ + round_up(r.addr - base_, slot_);
    std::uintptr_t hi = base_ + round_down(r.end() - base_, slot_);
    if (hi <= lo) return {r.size, 0, 0};
    if (chunk_floor(lo) != lo) lo = chunk_end(lo);
    if (hi > lo && chunk_end(hi - 1) != hi) hi = chunk_floor(hi - 1);
    if (hi <= lo) return {r.size, 0, 0};
    return {lo - r.addr, hi - lo, r.end() - hi};
  }

  /// The free range that `fit` picks for `size` bytes, shown the free ranges of at
  /// least that size with `usable` (the stream rules), or nullptr: through this
  /// walk itself where fit's pick is generic over the view, else a free_view.
  template <FitStrategy Fit, class Usable>
  [[nodiscard]] range* pick(const Fit& fit, std::size_t size, const Usable& usable) noexcept {
    struct walk {
      free_index::const_iterator it, end;
      const Usable* usable;
      [[nodiscard]] bool next(free_range& out) noexcept {
        if (it == end) return false;
        const range& r = *it++;
        out = free_range{r.addr, r.size, (*usable)(r), &r};
        return true;
      }
    } w{free_.lower_bound(size_key{size}, size_key_less{}), free_.end(), &usable};
    free_range chosen;
    if constexpr (requires { { fit.pick(w) } noexcept -> std::same_as<free_range>; }) {
      chosen = fit.pick(w);  // a strategy generic over the view walks the index directly
    } else {
      free_view view(&w, [](void* state, free_range& out) noexcept { return static_cast<walk*>(state)->next(out); });
      chosen = fit.pick(view);
    }
    return const_cast<range*>(static_cast<const range*>(chosen.key));
  }

  /// Calls f(r) for each free range of at least one slot, largest first, until f
  /// returns false.
  template <class F>
  void for_each_free_largest(F&& f) const noexcept {
    for (auto it = free_.rbegin(); it != free_.rend() && it->size >= slot_; ++it)
      if (!f(*it)) return;
  }

  /// Free range r as the stitch planner sees it. Pre: r is free.
  [[nodiscard]] stitch_source source_of(const range& r) const noexcept {
    const auto sp = split_of(r);
    stitch_source out{r.addr, r.size, sp.head, sp.whole, sp.tail, 0};
    if (sp.whole == 0) out.boundary = chunk_floor(r.addr) == r.addr ? r.addr : chunk_end(r.addr);
    return out;
  }

  /// Where chunks end, for the stitch planner.
  [[nodiscard]] chunk_ends ends() const noexcept {
    return chunk_ends(this, [](const void* self, std::uintptr_t p) noexcept {
      return static_cast<const arena*>(self)->chunk_end(p);
    });
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

  /// Finds where `size` bytes at `alignment` (at most a slot) fit by growing a free
  /// range (usable by the caller) into the hole beside it: the largest such free
  /// range, so the fewest new bytes.
  template <class Usable>
  [[nodiscard]] bool find_extension(std::size_t size, std::size_t alignment, const Usable& usable,
                                    extension& out) noexcept {
    bool found = false;
    for (range& h : holes_) {
      auto it = address_.iterator_to(h);
      if (it != address_.begin()) {
        range& f = *std::prev(it);
        consider(f, h, true, size, alignment, usable, found, out);
      }
      if (auto next = std::next(it); next != address_.end())
        consider(*next, h, false, size, alignment, usable, found, out);
    }
    return found;
  }

  /// Maps new chunks as e says. Needs 2 nodes. Returns the free range that now
  /// holds the neighbour and the new bytes.
  /// `g` says how many bytes at least and in what chunks.
  [[nodiscard]] result<range*> extend(const extension& e, const growth_plan& g) noexcept {
    const std::size_t bytes = std::max(e.bytes, std::min(g.floor, e.hole->size));
    const std::uintptr_t at = e.after ? e.hole->addr : e.hole->end() - bytes;
    const std::size_t q = quarantined_ranges_;
    auto r = populate(*e.hole, at, bytes, e.neighbour->segment, g);
    if (r || bytes == e.bytes || q != quarantined_ranges_) return r;  // a quarantine changed the hole
    // The surplus did not fit (the backend is nearly full): create only what is needed.
    return populate(*e.hole, e.after ? e.hole->addr : e.hole->end() - e.bytes, e.bytes, e.neighbour->segment, g);
  }

  /// Maps `bytes` of new chunks at the start of the smallest hole that holds them,
  /// as a free range of `segment`; `fresh` gets their address. `g` says how many
  /// bytes at least and in what chunks. Needs 2 nodes. Returns the free range
  /// holding them (merged with free neighbours).
  [[nodiscard]] result<range*> grow(std::size_t bytes, std::uint32_t segment, std::uintptr_t& fresh,
                                    const growth_plan& g) noexcept {
    auto it = holes_.lower_bound(size_key{bytes}, size_key_less{});
    if (it == holes_.end()) return errc::out_of_memory;  // address space exhausted
    const std::size_t want = std::max(bytes, std::min(g.floor, it->size));
    fresh = it->addr;
    const std::size_t q = quarantined_ranges_;
    auto r = populate(*it, it->addr, want, segment, g);
    if (r || want == bytes || q != quarantined_ranges_) return r;  // a quarantine changed the hole
    return populate(*it, it->addr, bytes, segment, g);  // the surplus did not fit: only what is needed
  }

  /// Maps `bytes` of new chunks spread over the largest holes, at most `ranges` of
  /// them, each at its hole's start, as free ranges of segment 0: for a shortfall no
  /// one hole holds (the address space cut up). Needs 2 nodes. Returns the bytes
  /// created (what was created stays, free, if the rest cannot be).
  std::size_t grow_scattered(std::size_t bytes, std::size_t ranges, const growth_plan& g) noexcept {
    std::size_t made = 0;
    for (std::size_t k = 0; made < bytes && k < ranges && !holes_.empty(); ++k) {
      range& h = *holes_.rbegin();  // the largest
      const std::size_t n = std::min(h.size, round_up(bytes - made, slot_));
      if (!nodes_.reserve(2) || !populate(h, h.addr, n, 0, g)) break;
      made += n;
    }
    return made;
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

  /// Unmaps and releases one unpinned whole chunk of at least `bytes` inside a free
  /// range whose stream work is known done: the smallest such chunk in the `scan`
  /// largest free ranges. Returns the bytes released (0: none).
  std::size_t release_one_chunk(std::size_t bytes, std::size_t scan) noexcept {
    range* best = nullptr;
    std::uintptr_t best_a = 0, best_e = 0;
    for (auto it = free_.rbegin(); it != free_.rend() && it->size >= bytes && scan > 0; ++it, --scan) {
      range& r = const_cast<range&>(*it);
      if (!streams_.known_done(r.tag)) continue;
      const auto sp = split_of(r);
      for (std::uintptr_t a = r.addr + sp.head, hi = a + sp.whole; a < hi;) {
        const std::uintptr_t e = chunk_end(a);
        if (e - a >= bytes && !kept(a) && (best == nullptr || e - a < best_e - best_a)) {
          best = &r;
          best_a = a;
          best_e = e;
        }
        a = e;
      }
    }
    if (best == nullptr || !nodes_.reserve(4)) return 0;
    if (backend_.unmap(best_a, best_e - best_a) != errc::ok) {
      ++held_.failed_cleanups;
      return 0;
    }
    const bool kept = !release_unmapped(best_a, best_e);
    (void)carve_hole(*best, best_a, best_e);
    if (kept) {
      quarantine(holding(best_a), best_a, best_e);
      return 0;
    }
    return best_e - best_a;
  }

  // ------------------------------------------------------------ lending between arenas

  /// Lends the smallest whole free chunk of `need` to `most` bytes (not borrowed
  /// itself, and mapped by no stitched block: lending it would make a cached block
  /// unusable) inside one of the `scan` smallest free ranges that hold `need` and
  /// whose stream work is known done: it becomes a lent range. Needs 2 nodes.
  /// False: none.
  [[nodiscard]] bool lend(std::size_t need, std::size_t most, std::size_t scan, loan& out) noexcept {
    range* best = nullptr;
    std::uintptr_t best_a = 0, best_e = 0;
    for (auto it = free_.lower_bound(size_key{need}, size_key_less{}); it != free_.end() && scan > 0; ++it, --scan) {
      range& r = const_cast<range&>(*it);
      if (!streams_.known_done(r.tag)) continue;
      const auto sp = split_of(r);
      for (std::uintptr_t a = r.addr + sp.head, hi = a + sp.whole; a < hi;) {
        const std::uintptr_t e = chunk_end(a);
        const slot& c = slot_of(a);
        if (e - a >= need && e - a <= most && !c.borrowed && c.stitch_refs == 0 &&
            (best == nullptr || e - a < best_e - best_a)) {
          best = &r;
          best_a = a;
          best_e = e;
        }
        a = e;
      }
    }
    if (best == nullptr || !nodes_.reserve(2)) return false;
    range& l = carve(*best, best_a, best_e - best_a);
    l.state = range_state::lent;
    lent_ += l.size;
    out = {chunk_of(best_a), best_a, best_e - best_a};
    return true;
  }

  /// The lent chunk at `home` is back: free again here (its work in the other arena
  /// known done), coalesced with its neighbours.
  void take_back(std::uintptr_t home) noexcept {
    range* r = starting_at(home);
    GMLAKE_ASSERT(r != nullptr && r->state == range_state::lent, "take_back of a chunk not lent");
    lent_ -= r->size;
    (void)release(*r, stream_tag{});
  }

  /// Borrows a whole free chunk of `need` to `most` bytes from the lender (lend()
  /// with `scan`) and maps it at the start of the smallest hole that holds it, as a
  /// free range of `segment`: one map and one access call, no new physical memory.
  /// Needs 3 nodes. On failure the loan goes back and nothing changed (but a
  /// quarantine, if an undo fails too).
  [[nodiscard]] result<range*> borrow(std::size_t need, std::size_t most, std::size_t scan,
                                      std::uint32_t segment) noexcept {
    if (lender_ == nullptr || !nodes_.reserve(3)) return errc::out_of_memory;
    auto h = holes_.lower_bound(size_key{need}, size_key_less{});
    if (h == holes_.end()) return errc::out_of_memory;
    loan l;
    if (!lender_->lend(need, std::min(most, h->size), scan, l)) return errc::out_of_memory;
    range& hole = *h;
    const std::uintptr_t at = hole.addr;
    const std::size_t first = (at - base_) / slot_, n = l.bytes / slot_;
    if (first + n > slots_.size()) {
      try {
        slots_.resize(std::max(first + n, slots_.size() + slots_.size() / 2));
      } catch (...) {
        lender_->take_back(l.home);
        return errc::out_of_memory;
      }
    }
    errc e = backend_.map(at, l.bytes, l.chunk);
    if (e == errc::ok) {
      e = backend_.set_access(at, l.bytes);
      if (e != errc::ok) {
        if (backend_.unmap(at, l.bytes) != errc::ok) {  // mapped here still: undo later, then give back
          ++held_.failed_cleanups;
          held_.quarantined.add(static_cast<std::int64_t>(l.bytes));
          set_chunk(first, n, l.chunk);
          for (std::size_t j = 0; j < n; ++j) slots_[first + j].pending = 3;
          slots_[first].home = l.home;
          owed_ += l.bytes;
          quarantine(hole, at, at + l.bytes);
          return e;
        }
      }
    }
    if (e != errc::ok) {
      lender_->take_back(l.home);
      return e;
    }
    set_chunk(first, n, l.chunk);
    for (std::size_t j = 0; j < n; ++j) {
      slots_[first + j].mapped = true;
      slots_[first + j].borrowed = true;
    }
    slots_[first].home = l.home;
    borrowed_ += l.bytes;
    held_.mapped.add(static_cast<std::int64_t>(l.bytes));
    return &occupy(hole, at, l.bytes, segment);
  }

  /// Gives back every borrowed chunk wholly inside a free range whose stream work is
  /// known done: unmapped here, free again in the lender. One whose unmap fails stays
  /// (a later call retries). Returns the bytes given back.
  std::size_t give_back_borrowed() noexcept {
    if (borrowed_ == 0) return 0;
    std::size_t given = 0;
    for (auto it = address_.begin(); it != address_.end();) {
      range* cur = &*it;
      ++it;
      if (!cur->is_free() || !streams_.known_done(cur->tag)) continue;
      for (bool more = true; more && cur->is_free();) {
        more = false;
        const auto sp = split_of(*cur);
        for (std::uintptr_t a = cur->addr + sp.head, hi = a + sp.whole; a < hi; a = chunk_end(a)) {
          if (!slot_of(a).borrowed) continue;
          const std::uintptr_t e = chunk_end(a);
          if (!nodes_.reserve(2)) return given;
          if (backend_.unmap(a, e - a) != errc::ok) {
            ++held_.failed_cleanups;
            continue;
          }
          const std::uintptr_t home = slot_of(a).home;
          for (std::uintptr_t c = a; c < e; c += slot_) slot_of(c) = slot{};
          borrowed_ -= e - a;
          held_.mapped.sub(static_cast<std::int64_t>(e - a));
          given += e - a;
          lender_->take_back(home);
          const bool rest = e < cur->end();
          cur = carve_hole(*cur, a, e);  // the rest of cur, or what follows the hole
          if (!rest) {  // another range: the outer loop judges it (its stream work)
            it = address_.iterator_to(*cur);
            break;
          }
          it = std::next(address_.iterator_to(*cur));
          more = true;
          break;
        }
      }
    }
    return given;
  }

  /// Retries the undo of every quarantined chunk; a quarantined range whose chunks
  /// are all undone becomes a hole again. No backend call when none is quarantined.
  void retry_quarantine() noexcept {
    if (quarantined_ranges_ == 0) return;
    for (auto it = address_.begin(); it != address_.end();) {
      range& q = *it;
      ++it;
      if (q.state != range_state::quarantined) continue;
      bool left = false;
      for (std::uintptr_t a = q.addr; a < q.end();) {
        slot& c = slot_of(a);
        if (c.pending == 0) {
          a += slot_;
          continue;
        }
        const std::size_t i = (a - base_) / slot_, n = c.count;
        if (c.pending == 3) {  // borrowed: unmapped, it goes back to the lender
          if (backend_.unmap(a, n * slot_) == errc::ok) {
            held_.quarantined.sub(static_cast<std::int64_t>(n * slot_));
            owed_ -= n * slot_;
            const std::uintptr_t home = c.home;
            for (std::size_t j = 0; j < n; ++j) slots_[i + j] = slot{};
            lender_->take_back(home);
          } else {
            ++held_.failed_cleanups;
          }
        }
        if (c.pending == 1) {
          if (backend_.unmap(a, n * slot_) == errc::ok) {
            for (std::size_t j = 0; j < n; ++j) slots_[i + j].pending = 2;
          } else {
            ++held_.failed_cleanups;
          }
        }
        if (c.pending == 2) {
          if (backend_.release(c.chunk) == errc::ok) {
            held_.quarantined.sub(static_cast<std::int64_t>(n * slot_));
            for (std::size_t j = 0; j < n; ++j) slots_[i + j] = slot{};
          } else {
            ++held_.failed_cleanups;
          }
        }
        if (slots_[i].pending != 0) left = true;
        a += n * slot_;
      }
      if (!left) {
        --quarantined_ranges_;
        q.state = range_state::hole;
        range& h = merge_holes(q);
        it = std::next(address_.iterator_to(h));
      }
    }
  }
  [[nodiscard]] std::size_t quarantined_ranges() const noexcept { return quarantined_ranges_; }

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
  /// (stitchable), free in partial chunks (heads and tails), free but whose stream
  /// work is not known done (not yet usable on other streams). O(ranges).
  struct tally_type {
    std::size_t reserved = 0, used = 0, free_whole = 0, free_partial = 0, free_pending = 0;
    std::size_t quarantined = 0;  ///< chunk bytes in quarantined ranges (not in reserved)
    std::size_t borrowed = 0;     ///< bytes of borrowed chunks (not in reserved)
    std::size_t lent = 0;         ///< bytes of chunks lent (in reserved, not in used)
  };
  [[nodiscard]] tally_type tally() const noexcept {
    tally_type t;
    for (const range& r : address_) {
      if (r.state == range_state::hole) continue;
      if (r.state == range_state::quarantined) continue;
      if (r.state == range_state::lent) {
        t.lent += r.size;
        continue;
      }
      if (!r.is_free()) {
        t.used += r.size;
        continue;
      }
      if (!streams_.known_done(r.tag)) t.free_pending += r.size;
      const auto sp = split_of(r);
      t.free_whole += sp.whole;
      t.free_partial += sp.head + sp.tail;
    }
    for (const slot& s : slots_) {
      if (s.mapped) (s.borrowed ? t.borrowed : t.reserved) += slot_;
      if (s.pending != 0) t.quarantined += slot_;
    }
    return t;
  }


  /// Calls on_chunk(addr, bytes) for each mapped chunk in address order, then
  /// on_piece(range) for each range within it, clipped to the chunk (a range may
  /// span chunks); the pieces tile the chunk.
  template <class OnChunk, class OnPiece>
  void visit_chunks(OnChunk&& on_chunk, OnPiece&& on_piece) const {
    if (size_ == 0) return;
    auto it = address_.begin();
    for (std::size_t i = 0; i < slots_.size(); i += slots_[i].count ? slots_[i].count : 1) {
      if (!slots_[i].mapped || slots_[i].first != i) continue;
      const std::uintptr_t lo = base_ + i * slot_, hi = lo + slots_[i].count * slot_;
      while (it != address_.end() && it->end() <= lo) ++it;
      if (it != address_.end() && it->state == range_state::lent) continue;  // the borrower shows it
      on_chunk(lo, hi - lo);
      for (auto r = it; r != address_.end() && r->addr < hi; ++r) {
        const std::uintptr_t a = std::max(r->addr, lo);
        on_piece(*r, a, std::min(r->end(), hi) - a);
      }
    }
  }

  /// Every stated property of the tiling, the indexes and the slots.
  [[nodiscard]] bool check(std::size_t& reserved, std::size_t& used, std::size_t& live) const noexcept {
    if (size_ == 0) return true;
    std::uintptr_t at = base_;
    std::size_t nfree = 0, nholes = 0, nquarantined = 0, pending_in_ranges = 0, pending = 0, lent = 0;
    const range* prev = nullptr;
    for (const range& r : address_) {
      if (r.addr != at || r.size == 0) return false;
      at = r.end();
      if (r.addr % block_alignment != 0 || r.size % block_alignment != 0) return false;
      if (r.state == range_state::quarantined) {
        ++nquarantined;
        if ((r.addr - base_) % slot_ != 0 || r.size % slot_ != 0) return false;
        for (std::uintptr_t c = r.addr; c < r.end(); c += slot_) {
          const std::size_t i = (c - base_) / slot_;
          if (i >= slots_.size() || slots_[i].mapped) return false;
          if (slots_[i].pending != 0) ++pending_in_ranges;
        }
      } else if (r.state == range_state::hole) {
        ++nholes;
        if ((r.addr - base_) % slot_ != 0 || r.size % slot_ != 0) return false;
        if (prev && prev->state == range_state::hole) return false;  // holes coalesce always
        for (std::uintptr_t c = r.addr; c < r.end(); c += slot_) {
          const std::size_t i = (c - base_) / slot_;
          if (i < slots_.size() && (slots_[i].mapped || slots_[i].pending != 0)) return false;
        }
      } else {
        for (std::uintptr_t c = round_down(r.addr - base_, slot_) + base_; c < r.end(); c += slot_) {
          const std::size_t i = (c - base_) / slot_;
          if (i >= slots_.size() || !slots_[i].mapped) return false;
        }
        if (r.state == range_state::lent) {  // exactly one chunk of this arena's own
          if (chunk_floor(r.addr) != r.addr || chunk_end(r.addr) != r.end() || slots_[(r.addr - base_) / slot_].borrowed) return false;
          lent += r.size;
        } else if (r.is_free()) {
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
    // Every chunk still to undo lies in a quarantined range, and every such range holds one.
    for (const slot& s : slots_)
      if (s.pending != 0) ++pending;
    if (pending != pending_in_ranges || nquarantined != quarantined_ranges_) return false;
    for (const range& r : free_)
      if (!r.is_free()) return false;
    for (const range& r : holes_)
      if (r.state != range_state::hole) return false;
    std::size_t mine = 0, borrowed = 0, owed = 0;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const slot& s = slots_[i];
      if (s.mapped) (s.borrowed ? borrowed : mine) += slot_;
      if (s.pending == 3) owed += slot_;
      if (s.borrowed && (!s.mapped || slots_[s.first].home == 0 || lender_ == nullptr)) return false;
    }
    reserved += mine;
    return mine == reserved_ && borrowed == borrowed_ && owed == owed_ && lent == lent_;
  }

  /// Every slot's stitch_refs is refs[i] (0 past its end), and every slot of a
  /// chunk has its chunk's count.
  [[nodiscard]] bool check_refs(const std::vector<std::uint32_t>& refs) const noexcept {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const std::uint32_t want = i < refs.size() ? refs[i] : 0;
      if (slots_[i].stitch_refs != want) return false;
      if (want != 0 && !slots_[i].mapped) return false;
    }
    return true;
  }

 private:
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
  void consider(range& f, range& h, bool after, std::size_t size, std::size_t alignment, const Usable& usable,
                bool& found, extension& out) noexcept {
    if (!f.is_free() || !usable(f)) return;
    // After f: the request starts at f's first aligned byte. Before f: at the new
    // bytes' start, a slot boundary (aligned).
    const std::uintptr_t start = round_up(f.addr, alignment);
    if (start + size <= f.end()) return;  // f holds it already
    std::size_t bytes = round_up(after ? start + size - f.end() : size - std::min(size, f.size), slot_);
    if (bytes == 0) bytes = slot_;
    if (bytes > h.size) return;
    if (!found || f.size > out.neighbour->size) {
      out = {&f, &h, bytes, after};
      found = true;
    }
  }

  /// Creates and maps chunks over [at, at+bytes) inside hole h (as large as `g`
  /// allows, the first ones largest; where the backend has no room for one that
  /// large, halving down to one slot), makes them accessible, and turns that part of
  /// h into a free range. On failure undoes every step and leaves h as it was.
  result<range*> populate(range& h, std::uintptr_t at, std::size_t bytes, std::uint32_t segment,
                          const growth_plan& g) noexcept {
    GMLAKE_ASSERT(h.state == range_state::hole && at >= h.addr && at + bytes <= h.end(), "populate outside a hole");
    if (!nodes_.reserve(3)) return errc::out_of_memory;  // the new range, or a quarantine
    const std::size_t first = (at - base_) / slot_, n = bytes / slot_;
    if (first + n > slots_.size()) {
      try {
        slots_.resize(std::max(first + n, slots_.size() + slots_.size() / 2));
      } catch (...) {
        return errc::out_of_memory;
      }
    }
    std::size_t per = g.max_chunk > slot_ ? g.max_chunk / slot_ : 1;  // slots per chunk
    if (g.big_growth != 0 && bytes >= g.big_growth) per = std::max(per, g.big_chunk / slot_);
    std::size_t created = 0, mapped = 0;  // slots covered by created / mapped chunks
    errc failure = errc::ok;
    while (created < n) {
      const std::size_t k = std::min(per, n - created);
      auto c = backend_.create(k * slot_);
      if (!c && c.error == errc::out_of_memory && k > 1) {
        per = k / 2;  // no room for a handle this large (near capacity): smaller ones, down to one slot
        continue;
      }
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
        const errc e = backend_.map(at + mapped * slot_, h.count * slot_, h.chunk);
        if (e != errc::ok) {
          failure = e;
          break;
        }
        mapped += h.count;
      }
    }
    if (failure == errc::ok) {
      failure = backend_.set_access(at, bytes);
    }
    if (failure != errc::ok) {  // roll back; a chunk whose undo fails is quarantined
      std::size_t lo = n, hi = 0;  // the slots of the chunks kept
      for (std::size_t i = 0; i < created;) {
        slot& c = slots_[first + i];
        const std::size_t k = c.count;
        std::uint8_t pending = 0;
        if (i < mapped && (hold_ || backend_.unmap(at + i * slot_, k * slot_) != errc::ok)) pending = 1;
        else if (hold_ || backend_.release(c.chunk) != errc::ok) pending = 2;
        if (pending != 0) {
          if (!hold_) ++held_.failed_cleanups;
          held_.quarantined.add(static_cast<std::int64_t>(k * slot_));
          for (std::size_t j = 0; j < k; ++j) slots_[first + i + j].pending = pending;
          lo = std::min(lo, i);
          hi = i + k;
        } else {
          for (std::size_t j = 0; j < k; ++j) slots_[first + i + j] = slot{};
        }
        i += k;
      }
      if (hi != 0) quarantine(h, at + lo * slot_, at + hi * slot_);
      return failure;
    }
    for (std::size_t i = 0; i < n; ++i) {
      slots_[first + i].mapped = true;
      slots_[first + i].stitch_refs = 0;
    }
    for (std::size_t i = 0; i < n; i += slots_[first + i].count) held_.chunks.add(1);
    held_.reserved.add(static_cast<std::int64_t>(bytes));
    reserved_ += bytes;
    held_.mapped.add(static_cast<std::int64_t>(bytes));

    return &occupy(h, at, bytes, segment);  // the new range takes the hole's start or its end
  }

  /// Whether the chunk at a stays when free chunks are released: a stitched block
  /// maps it, or it is borrowed (the lender's to release).
  [[nodiscard]] bool kept(std::uintptr_t a) noexcept {
    const slot& s = slot_of(a);
    return s.stitch_refs != 0 || s.borrowed;
  }

  /// Slots [first, first + n) hold one chunk c.
  void set_chunk(std::size_t first, std::size_t n, const chunk_type& c) noexcept {
    slots_[first].chunk = c;
    for (std::size_t j = 0; j < n; ++j) {
      slots_[first + j].first = static_cast<std::uint32_t>(first);
      slots_[first + j].count = static_cast<std::uint32_t>(n);
      slots_[first + j].stitch_refs = 0;
    }
  }

  /// Turns [at, at + bytes) of hole h, at its start or its end, into a free range of
  /// `segment` (merged with free neighbours). Needs 1 node. Returns the free range.
  range& occupy(range& h, std::uintptr_t at, std::size_t bytes, std::uint32_t segment) noexcept {
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
    return release(*fresh, stream_tag{});
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
      // split_of gives whole chunks: skip pinned and borrowed ones, release a run of the others.
      while (a < hi && kept(a)) a = chunk_end(a);
      if (a >= hi) break;
      std::uintptr_t b = a;
      while (b < hi && !kept(b)) b = chunk_end(b);
      if (!nodes_.reserve(4)) break;
      if (backend_.unmap(a, b - a) != errc::ok) {
        ++held_.failed_cleanups;  // the chunks stay mapped and free: a later release retries
        break;
      }
      // Chunks whose release fails are kept, quarantined, from the first to the last.
      std::uintptr_t qa = 0, qb = 0;
      for (std::uintptr_t c = a; c < b;) {
        const std::uintptr_t e = chunk_end(c);
        if (release_unmapped(c, e)) {
          released += e - c;
        } else {
          if (qb == 0) qa = c;
          qb = e;
        }
        c = e;
      }
      // [cur.addr, a) stays free, [a, b) becomes a hole, [b, cur.end) stays free.
      const bool rest = b < cur->end();
      cur = carve_hole(*cur, a, b);
      if (qb != 0) quarantine(holding(qa), qa, qb);
      if (!rest) {  // cur is what follows the hole, another range: the caller judges it (its stream work)
        next = address_.iterator_to(*cur);
        return released;
      }
    }
    // The caller's iterator may point at a node merged away: continue after cur.
    next = std::next(address_.iterator_to(*cur));
    return released;
  }

  /// Releases the chunk [c, e), just unmapped. On failure keeps it in its slots,
  /// to be released (pending 2), out of the reserved bytes and into the
  /// quarantined ones; the caller quarantines its address space. True: released.
  bool release_unmapped(std::uintptr_t c, std::uintptr_t e) noexcept {
    held_.chunks.sub(1);
    if (backend_.release(slot_of(c).chunk) == errc::ok) {
      for (; c < e; c += slot_) forget_slot(slot_of(c));
      return true;
    }
    ++held_.failed_cleanups;
    held_.quarantined.add(static_cast<std::int64_t>(e - c));
    for (; c < e; c += slot_) {
      slot& s = slot_of(c);
      s.mapped = false;
      s.stitch_refs = 0;
      s.pending = 2;
      held_.reserved.sub(static_cast<std::int64_t>(slot_));
      held_.mapped.sub(static_cast<std::int64_t>(slot_));
      reserved_ -= slot_;
    }
    return false;
  }

  /// Turns [a, b) of hole h into a quarantined range. Needs 2 nodes.
  void quarantine(range& h, std::uintptr_t a, std::uintptr_t b) noexcept {
    GMLAKE_ASSERT(h.state == range_state::hole && a >= h.addr && b <= h.end() && a < b, "quarantine outside a hole");
    ++quarantined_ranges_;
    holes_.erase(holes_.iterator_to(h));
    if (a == h.addr && b == h.end()) {
      h.state = range_state::quarantined;
      return;
    }
    range* q = make(a, b - a, range_state::quarantined, 0, stream_tag{});
    if (a == h.addr) {
      address_.insert_before(address_.iterator_to(h), *q);
      h.addr = b;
      h.size -= b - a;
    } else {
      const std::uintptr_t h_end = h.end();
      address_.insert_before(std::next(address_.iterator_to(h)), *q);
      h.size = a - h.addr;
      if (b < h_end) {
        range* after = make(b, h_end - b, range_state::hole, 0, stream_tag{});
        address_.insert_before(std::next(address_.iterator_to(*q)), *after);
        holes_.insert(*after);
      }
    }
    holes_.insert(h);
  }

  void forget_slot(slot& s) noexcept {
    s = slot{};
    held_.reserved.sub(static_cast<std::int64_t>(slot_));
    held_.mapped.sub(static_cast<std::int64_t>(slot_));
    reserved_ -= slot_;
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
    range& h = merge_holes(mid);
    return after ? after : &h;
  }

  /// Hole `mid` (in no index but the address one) merged with the holes beside it
  /// and indexed. Returns it.
  range& merge_holes(range& mid) noexcept {
    auto it = address_.iterator_to(mid);
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
    return mid;
  }

  Backend& backend_;
  node_pool<range>& nodes_;
  stream_table<Backend>& streams_;
  footprint& held_;
  std::size_t slot_;
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  std::uint32_t segments_ = 0;
  arena* lender_ = nullptr;   ///< where borrow() takes chunks from
  std::size_t reserved_ = 0;  ///< physical bytes of this arena's chunks (borrowed ones not)
  std::size_t borrowed_ = 0;  ///< bytes of the chunks borrowed from lender_, mapped here
  std::size_t owed_ = 0;      ///< bytes of borrowed chunks quarantined, to give back
  std::size_t lent_ = 0;      ///< bytes of this arena's chunks lent
  std::size_t quarantined_ranges_ = 0;
  bool hold_ = false;  ///< capture mode: a failed growth's undo waits (quarantined)
  address_index address_;
  free_index free_;
  free_index holes_;
  std::vector<slot> slots_;
};

} // namespace gmlake::detail
