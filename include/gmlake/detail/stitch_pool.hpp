// gmlake/detail/stitch_pool.hpp - the stitched blocks: their mapping, their cache
// (the sPool of the paper), and their end.
//
// The pool owns every stitched block from build() to unmap(): it maps the planned
// pieces into a new reservation (rolling back on failure), finds a block by the
// pointer it handed out, claims and releases the arena ranges under a block, keeps
// the inactive ones in a cache ordered by capacity and in an LRU list, and evicts
// them as the EvictionPolicy says, choosing from a view of the cache. A block maps
// chunks of the large arena again; the pool adds its mappings to the slots'
// `stitch_refs`, so those chunks are not released while it stands.
//
// A cached block whose pieces were partly taken since can be repaired instead of
// stitched anew: each chunk under its prefix that is no longer free is unmapped
// from it and free chunks of the same bytes are mapped in its place, so that only
// those chunks cost driver calls (repair()). A cached block whose pieces are all
// free can serve a larger request once free chunks are mapped after it, in the room
// its reservation leaves past its mapping (appendable(), append()): only those
// chunks cost driver calls.
//
// A block whose unmap or address free fails (in a rollback, or when it is given
// up on) is not forgotten: it goes to a quarantine list, its pieces' chunks stay
// pinned while it may still map them, and retry_quarantine() (on the next
// growth, on release_cached()) and close() retry what is left.
//
// A cached block's first piece may start elsewhere in its first chunk, over bytes
// the block maps already (first_start(), slide(), and repair() where that leaves
// fewer chunks to replace): its pointer and capacity change, its mapping does not.
//
// All member functions are noexcept; those that can fail say so by value and leave
// the pool as it was (apart from a quarantine, and a cached block whose first piece
// moved: it keeps its new start). Pre for every call: the caller holds the
// allocator's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <array>
#include <iterator>
#include <new>
#include <span>
#include <vector>

#include "../concepts.hpp"
#include "arena.hpp"
#include "footprint.hpp"
#include "node_pool.hpp"
#include "stitch_block.hpp"
#include "stream_table.hpp"

namespace gmlake::detail {

template <PhysicalBackend Backend>
class stitch_pool {
 public:
  using arena_type = arena<Backend>;

  stitch_pool(Backend& backend, arena_type& large, stream_table<Backend>& streams, node_pool<range>& nodes,
              footprint& held) noexcept
      : backend_(backend), large_(large), streams_(streams), nodes_(nodes), held_(held) {}
  stitch_pool(const stitch_pool&) = delete;
  stitch_pool& operator=(const stitch_pool&) = delete;

  /// Unmaps every block, in use or not (the allocator is going away).
  void close() noexcept {
    while (!by_pointer_.empty()) (void)unmap(*by_pointer_.begin(), true);
    retry_quarantine(close_attempts);
    while (!quarantine_.empty()) forget(quarantine_.front());  // nothing can retry after this
  }

  /// Retries what is left to undo of each quarantined block, each call up to
  /// `attempts` times; a block with nothing left goes. No call when none is kept.
  void retry_quarantine(int attempts = 1) noexcept {
    for (auto it = quarantine_.begin(); it != quarantine_.end();) {
      stitch_block& b = *it++;
      if (b.pending_unmap != 0) {
        // A block given up on after use is unmapped only once the work before its
        // free is done (its first undo may have found no way to wait for it).
        if (!streams_.wait(b.tag)) continue;
        if (b.hole_at != 0) {  // the mapped bytes before the hole first
          if (retry([&] { return backend_.unmap(b.va, b.hole_at); }, attempts) != errc::ok) {
            ++held_.failed_cleanups;
            continue;
          }
          b.hole_bytes += b.hole_at;
          b.hole_at = 0;
        }
        const std::size_t after = b.hole_bytes;
        if (after < b.pending_unmap &&
            retry([&] { return backend_.unmap(b.va + after, b.pending_unmap - after); }, attempts) != errc::ok) {
          ++held_.failed_cleanups;
          continue;
        }
        for (const auto& p : b.pieces) large_.pin(p.addr, p.end(), -1);
        b.pending_unmap = 0;
      }
      if (retry([&] { return backend_.address_free(b.va, b.reserved); }, attempts) != errc::ok) {
        ++held_.failed_cleanups;
        continue;
      }
      forget(b);
    }
  }
  [[nodiscard]] std::size_t quarantined_count() const noexcept { return quarantine_.size(); }
  /// Virtual bytes of the quarantined blocks' reservations.
  [[nodiscard]] std::size_t quarantined_bytes() const noexcept {
    std::size_t n = 0;
    for (const stitch_block& b : quarantine_) n += b.reserved;
    return n;
  }

  // ------------------------------------------------------------ lookup

  /// The block handed out at p (in use or cached), or nullptr.
  [[nodiscard]] stitch_block* find(std::uintptr_t p) noexcept {
    auto it = by_pointer_.find(p);
    return it == by_pointer_.end() ? nullptr : &*it;
  }
  [[nodiscard]] std::size_t cached_count() const noexcept { return lru_.size(); }
  [[nodiscard]] std::size_t cached_bytes() const noexcept { return cached_bytes_; }
  /// Calls f(block) for each stitched block, in address order of its pointer.
  template <class F>
  void visit(F&& f) const {
    for (const stitch_block& b : by_pointer_) f(b);
  }

  // ------------------------------------------------------------ build and claim

  /// Maps the pieces side by side into a new reservation, which leaves room for
  /// `room` x their bytes to be appended later (append()). Returns the new block,
  /// neither in use nor cached, or nullptr (nothing changed).
  [[nodiscard]] stitch_block* build(std::span<const stitch_piece> pieces, std::size_t room = 0) noexcept {
    std::size_t mapped = 0;
    for (const auto& p : pieces) mapped += span_bytes(p);
    const std::size_t reserved = mapped * (1 + std::min(room, max_room));
    auto* b = new (std::nothrow) stitch_block;
    if (b == nullptr) return nullptr;
    try {
      b->pieces.assign(pieces.begin(), pieces.end());
      b->claimed.assign(pieces.size(), nullptr);
    } catch (...) {
      delete b;
      return nullptr;
    }
    auto va = backend_.reserve(reserved);
    if (!va) {
      delete b;
      return nullptr;
    }
    std::size_t done = 0;
    errc failure = errc::ok;
    for (const auto& p : pieces) {
      large_.for_each_chunk(p.addr, p.end(), [&](std::uintptr_t, std::size_t bytes, const auto& chunk) {
        if (failure != errc::ok) return;
        failure = backend_.map(va.value + done, bytes, chunk);
        if (failure == errc::ok) done += bytes;
      });
      if (failure != errc::ok) break;
    }
    if (failure == errc::ok) failure = backend_.set_access(va.value, mapped);
    if (failure != errc::ok) {  // roll back; what cannot be undone now is quarantined
      std::size_t left = done;  // mapped bytes still to unmap
      if (!hold_) {  // in capture mode, all of it: no unmap and no address free until it is off
        if (done == 0 || backend_.unmap(va.value, done) == errc::ok) left = 0;  // one call over every chunk
        if (left == 0 && backend_.address_free(va.value, reserved) == errc::ok) {
          delete b;
          return nullptr;
        }
        ++held_.failed_cleanups;
      }
      b->va = va.value;
      b->mapped = mapped;
      b->reserved = reserved;
      b->pending_unmap = left;
      b->pending_free = true;
      if (b->pending_unmap != 0)
        for (const auto& p : pieces) large_.pin(p.addr, p.end(), 1);  // its chunks stay while it may map them
      keep(*b);
      return nullptr;
    }
    for (const auto& p : pieces) {
      large_.pin(p.addr, p.end(), 1);
      b->capacity += p.size;
    }
    b->va = va.value;
    b->mapped = mapped;
    b->reserved = reserved;
    b->pointer = va.value + (pieces.front().addr - large_.chunk_floor(pieces.front().addr));
    by_pointer_.insert(*b);
    held_.stitched.add(1);
    held_.mapped.add(static_cast<std::int64_t>(mapped));
    return b;
  }

  /// Claims the arena ranges under b's first `size` bytes, if all are free and
  /// usable on stream s; b is then in use (and out of the cache).
  [[nodiscard]] bool claim(stitch_block& b, std::size_t size, std::size_t requested, std::uint32_t s) noexcept {
    const std::size_t k = claimable(b, size, s);
    if (k == 0 || !nodes_.reserve(2 * k)) return false;
    std::size_t left = size;
    for (std::size_t i = 0; i < k; ++i) {
      const auto& p = b.pieces[i];
      const std::size_t len = left < p.size ? left : p.size;
      range& u = large_.carve(large_.holding(p.addr), p.addr, len);
      u.owner = &b;
      b.claimed[i] = &u;
      left -= len;
    }
    b.claimed_count = k;
    if (b.cached) uncache(b);
    b.in_use = true;
    b.requested = requested;
    b.active = size;
    return true;
  }

  /// S1 on the cache: claims the first of the `scan` smallest cached blocks of at
  /// least `size` bytes, at a pointer aligned to `alignment`, that can be claimed,
  /// or returns nullptr.
  [[nodiscard]] stitch_block* reuse(std::size_t size, std::size_t requested, std::uint32_t s, std::size_t scan,
                                    std::size_t alignment = block_alignment) noexcept {
    auto it = cache_.lower_bound(size, stitch_capacity_less{});
    for (std::size_t n = 0; it != cache_.end() && n < scan; ++it, ++n) {
      stitch_block& b = *it;
      if (b.pointer % alignment == 0 && claim(b, size, requested, s)) return &b;
    }
    return nullptr;
  }

  /// S1 on the cache, moved: of the `scan` smallest cached blocks of at least `size`
  /// bytes, the first that can be claimed once its first piece starts where
  /// first_start() says, or nullptr. The block keeps its new start (also if the claim
  /// then fails for want of memory: it stays cached).
  [[nodiscard]] stitch_block* slide(std::size_t size, std::size_t requested, std::uint32_t s, std::size_t scan,
                                    std::size_t alignment = block_alignment) noexcept {
    if (!slide_) return nullptr;  // no block moves: reuse() has tried them all as they are
    auto it = cache_.lower_bound(size, stitch_capacity_less{});
    for (std::size_t n = 0; it != cache_.end() && n < scan; ++it, ++n) {
      stitch_block& b = *it;
      const std::uintptr_t at = first_start(b, size, s, alignment);
      if (at == b.pieces.front().addr || !with_first_at(b, at, [&] { return claimable(b, size, s) != 0; })) continue;
      move_first(b, at);
      return claim(b, size, requested, s) ? &b : nullptr;  // else it stays cached, moved
    }
    return nullptr;
  }

  /// A cached block that a request of `size` bytes, more than it holds, can use
  /// once chunks are appended to it: of the `scan` largest cached blocks of fewer
  /// bytes (pointer aligned to `alignment`), the largest whose pieces are all free
  /// on stream s, whose last piece ends at its chunk's end (or can: the rest of
  /// that chunk is free there, and the piece takes it), and whose reservation leaves
  /// room for the rest (rounded up to whole slots of `slot` bytes; the appended
  /// chunks may be larger). Or nullptr. The block returned may hold `size` bytes.
  [[nodiscard]] stitch_block* appendable(std::size_t size, std::uint32_t s, std::size_t scan, std::size_t alignment,
                                         std::size_t slot) noexcept {
    if (hold_) return nullptr;
    auto it = cache_.lower_bound(size, stitch_capacity_less{});
    for (std::size_t n = 0; it != cache_.begin() && n < scan; ++n) {
      stitch_block& b = *--it;
      if (b.capacity == 0 || b.pointer % alignment != 0) continue;
      const stitch_piece& last = b.pieces.back();
      const std::size_t rest = large_.chunk_end(last.end() - 1) - last.end();  // of its chunk, after it
      if (rest != 0) {  // one free range from the piece's start to its chunk's end, as claim() needs
        const range& r = large_.holding(last.addr);
        if (!r.is_free() || r.end() < last.end() + rest || !streams_.usable(r.tag, s)) continue;
        const auto under = [&](const stitch_piece& p) { return p.addr < last.end() + rest && last.end() < p.end(); };
        if (std::any_of(b.pieces.begin(), b.pieces.end() - 1, under)) continue;  // its first piece, say
      }
      if (b.reserved - b.mapped < round_up(size - std::min(size, b.capacity + rest), slot)) continue;
      if (claimable(b, b.capacity, s) == 0) continue;
      if (rest != 0) {  // the piece takes the rest of its chunk: mapped in b already
        uncache(b);
        b.pieces.back().size += rest;
        b.capacity += rest;
        cache(b);
      }
      return &b;
    }
    return nullptr;
  }

  /// Maps `pieces` (each from a chunk boundary, the last ending at its chunk's end or
  /// inside it, none under b) after cached block b's mapping, in the room its
  /// reservation leaves, and makes them accessible: the block then holds their bytes
  /// too. False if they do not fit the room or a call fails: b is then as it was,
  /// still cached, or, if the undo fails too, quarantined once the work before its
  /// free is done (a wait, on that double failure only).
  [[nodiscard]] bool append(stitch_block& b, std::span<const stitch_piece> pieces) noexcept {
    std::size_t bytes = 0;
    for (const auto& p : pieces) bytes += span_bytes(p);
    if (bytes == 0 || bytes > b.reserved - b.mapped) return false;
    try {
      b.pieces.reserve(b.pieces.size() + pieces.size());
      b.claimed.reserve(b.pieces.size() + pieces.size());
    } catch (...) {
      return false;
    }
    const std::uintptr_t at = b.va + b.mapped;
    std::size_t done = 0;
    errc failure = errc::ok;
    for (const auto& p : pieces) {
      large_.for_each_chunk(p.addr, p.end(), [&](std::uintptr_t, std::size_t n, const auto& chunk) {
        if (failure != errc::ok) return;
        failure = backend_.map(at + done, n, chunk);
        if (failure == errc::ok) done += n;
      });
      if (failure != errc::ok) break;
    }
    if (failure == errc::ok) failure = backend_.set_access(at, bytes);
    uncache(b);  // its capacity changes, or it is given up on
    if (failure != errc::ok && (done == 0 || backend_.unmap(at, done) == errc::ok)) {
      cache(b);  // undone: as it was
      return false;
    }
    for (const auto& p : pieces) {  // the appended chunks (or, undo failed, those that may stay mapped)
      large_.pin(p.addr, p.end(), 1);
      b.pieces.push_back(p);
      b.claimed.push_back(nullptr);
    }
    if (failure != errc::ok) {
      // Given up on: its whole mapping is unmapped later, so the work before its
      // free must be done first (it was usable on the stream, not known done).
      ++held_.failed_cleanups;
      (void)streams_.wait(b.tag);
      drop(b);
      b.mapped += done;
      b.pending_unmap = b.mapped;
      b.pending_free = true;
      keep(b);
      return false;
    }
    for (const auto& p : pieces) b.capacity += p.size;
    b.mapped += bytes;
    held_.mapped.add(static_cast<std::int64_t>(bytes));
    cache(b);
    return true;
  }

  /// S1 on the cache, repaired: of the `scan` smallest cached blocks of at least
  /// `size` bytes (pointer aligned to `alignment`) whose work before their free is
  /// done, the one whose first `size` bytes can be claimed on stream s once the
  /// fewest chunks (at most `max_chunks`) are replaced: chunks taken by other
  /// requests since it was cached, or pending on another stream. Each is unmapped
  /// from the block and free whole chunks whose bytes add up to its bytes, found
  /// outside the block, are mapped in its place (unmap, map and set access over
  /// that chunk's bytes only: a fraction of stitching anew). Then the block is
  /// claimed. Returns it, or nullptr; a replacement that fails is
  /// undone (the block stays cached), or, if the undo fails too, the block is
  /// quarantined.
  [[nodiscard]] stitch_block* repair(std::size_t size, std::size_t requested, std::uint32_t s, std::size_t scan,
                                     std::size_t alignment, std::size_t max_chunks) noexcept {
    if (hold_ || max_chunks == 0) return nullptr;  // no unmap while capturing
    repair_plan best;
    stitch_block* chosen = fewest_blocked(size, s, scan, alignment, max_chunks, best,
                                          [&](const stitch_block& c, repair_plan& p) { return find_replacements(c, s, p); });
    if (chosen == nullptr) return nullptr;
    stitch_block& b = *chosen;
    if (best.first != b.pieces.front().addr) move_first(b, best.first);
    std::vector<stitch_piece> pieces;
    try {
      const std::size_t most = b.pieces.size() + best.count * (repair_fresh_max + 1);
      pieces.reserve(most);
      b.claimed.reserve(most);
    } catch (...) {
      return nullptr;
    }
    std::size_t done = 0;
    swap_result r = swap_result::done;
    for (; done < best.count; ++done)
      if ((r = replace(b, best.chunks[done])) != swap_result::done) break;
    // The pieces with each replaced chunk's bytes taken from its replacements; a
    // chunk left unmapped by a failed undo (broken) is left out.
    const std::size_t applied = done + (r == swap_result::broken ? 1 : 0);
    relay(b, std::span(best.chunks.data(), applied), pieces);
    b.pieces.swap(pieces);
    b.claimed.assign(b.pieces.size(), nullptr);  // within the reserved capacity
    if (r == swap_result::broken || r == swap_result::no_access) {  // to be unmapped, whole or around the hole
      uncache(b);
      drop(b);
      b.pending_unmap = b.mapped;
      b.pending_free = true;
      keep(b);
      return nullptr;
    }
    if (done < best.count) return nullptr;  // undone: still cached, sound
    // Claimed, unless adjacent free ranges under one piece stay apart (freed on
    // two streams, both with work pending): then it stays cached, repaired.
    return claim(b, size, requested, s) ? &b : nullptr;
  }

  static constexpr std::size_t repair_max = 8;  // chunks replaced per repair at most

  /// The chunks a repair would replace: their bytes, how many, and their sum.
  struct repair_need {
    std::array<std::size_t, repair_max> bytes{};
    std::size_t count = 0, total = 0;
  };

  /// Of the blocks repair() looks at, the one whose first `size` bytes have the
  /// fewest chunks to replace (at most `max_chunks`) and whose work before its free
  /// is done: the bytes of those chunks, whether or not free chunks could replace
  /// them (none: count 0). No change.
  [[nodiscard]] repair_need needed_for_repair(std::size_t size, std::uint32_t s, std::size_t scan, std::size_t alignment,
                                              std::size_t max_chunks) noexcept {
    repair_need out;
    repair_plan best;
    if (hold_ || max_chunks == 0 ||
        fewest_blocked(size, s, scan, alignment, max_chunks, best, [](const stitch_block&, repair_plan&) { return true; }) ==
            nullptr)
      return out;
    out.count = best.count;
    for (std::size_t i = 0; i < best.count; ++i) out.total += (out.bytes[i] = best.chunks[i].bytes);
    return out;
  }

  /// Gives b's arena ranges back (freed on the stream of `tag`) and caches b.
  void release(stitch_block& b, stream_tag tag) noexcept {
    for (std::size_t i = 0; i < b.claimed_count; ++i) large_.release(*b.claimed[i], tag);
    b.claimed_count = 0;
    b.in_use = false;
    b.tag = tag;
    cache(b);
  }

  /// While held (capture mode), nothing is unmapped: blocks stay cached.
  void set_hold(bool on) noexcept { hold_ = on; }
  /// Whether a cached block's first piece may move (first_start()); on by default.
  void set_slide(bool on) noexcept { slide_ = on; }

  /// A block just built that could not be claimed: unmapped, or cached if it
  /// cannot be now (release_cached() retries).
  void discard(stitch_block& b) noexcept {
    if (!unmap(b, false)) cache(b);
  }

  // ------------------------------------------------------------ eviction and release

  /// What the eviction policy sees; `mapped` is every byte mapped (arenas included).
  [[nodiscard]] stitch_cache_view view() const noexcept {
    return {lru_.size(), cached_bytes_, static_cast<std::size_t>(held_.mapped.current)};
  }

  /// Unmaps cached blocks, each chosen by the policy, while it says the cache is
  /// over capacity. Returns how many.
  template <EvictionPolicy E>
  std::size_t evict(const E& policy) noexcept {
    std::size_t n = 0;
    while (!lru_.empty() && policy.over_capacity(view())) {
      const stitch_cache_entries entries(this, lru_.size(), &entry_at);
      stitch_block* victim = find(policy.victim(entries).pointer);
      if (victim == nullptr || !victim->cached || !unmap(*victim, false)) break;
      ++n;
    }
    return n;
  }

  /// Unmaps the cached blocks, least recently used first, until one cannot be.
  void unmap_cached() noexcept {
    while (!lru_.empty())
      if (!unmap(lru_.front(), false)) break;
  }

  // ------------------------------------------------------------ invariants

  /// The pool's own properties, the claimed ranges of each block in use, and that
  /// each slot's stitch_refs counts the blocks that map its chunk. Adds the blocks in
  /// use to `live`.
  [[nodiscard]] bool check(std::size_t& live) const noexcept {
    std::size_t cached = 0, cached_bytes = 0;
    for (const stitch_block& b : by_pointer_) {
      std::size_t capacity = 0;
      for (std::size_t i = 0; i < b.pieces.size(); ++i) {  // disjoint: no byte handed out twice
        capacity += b.pieces[i].size;
        for (std::size_t j = 0; j < i; ++j)
          if (b.pieces[i].addr < b.pieces[j].end() && b.pieces[j].addr < b.pieces[i].end()) return false;
      }
      if (capacity != b.capacity) return false;
      if (b.in_use) {
        ++live;
        std::size_t sum = 0;
        for (std::size_t i = 0; i < b.claimed_count; ++i) {
          if (b.claimed[i]->owner != &b || b.claimed[i]->state != range_state::used) return false;
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
    if (static_cast<std::int64_t>(by_pointer_.size()) != held_.stitched.current) return false;
    if (static_cast<std::int64_t>(quarantine_.size()) != held_.quarantined_stitches.current) return false;
    for (const stitch_block& b : quarantine_)
      if (b.in_use || b.cached || !b.pending_free || b.pending_unmap > b.mapped) return false;
    std::vector<std::uint32_t> refs;
    try {
      refs.assign(large_.slot_count(), 0);
    } catch (...) {
      return true;  // no memory to check the counts with: the rest holds
    }
    for (const stitch_block& b : by_pointer_)
      for (const auto& p : b.pieces) large_.for_each_slot(p.addr, p.end(), [&](std::size_t i) { ++refs[i]; });
    for (const stitch_block& b : quarantine_)  // pinned while they may still map their pieces
      if (b.pending_unmap != 0)
        for (const auto& p : b.pieces) large_.for_each_slot(p.addr, p.end(), [&](std::size_t i) { ++refs[i]; });
    return large_.check_refs(refs);
  }
  /// Bytes mapped by all blocks.
  [[nodiscard]] std::size_t mapped_bytes() const noexcept {
    std::size_t n = 0;
    for (const stitch_block& b : by_pointer_) n += b.mapped;
    return n;
  }

 private:
  static constexpr std::size_t max_room = 16;         // room to append, in mappings' bytes, at most
  static constexpr std::size_t repair_fresh_max = 4;  // free chunks that replace one at most
  static constexpr std::size_t repair_candidates = 64;

  /// A chunk of a block to replace: at arena address `old`, mapped at `va`, under
  /// piece `piece` (`edge`: only partly, at the piece's start or end); `fresh`: the
  /// free chunks that replace it, in order.
  struct swap {
    std::uintptr_t old = 0, va = 0;
    std::size_t bytes = 0, piece = 0;
    bool edge = false;
    std::array<stitch_piece, repair_fresh_max> fresh{};
    std::size_t fresh_count = 0;
  };
  struct repair_plan {
    std::array<swap, repair_max> chunks{};
    std::size_t count = 0;
    std::uintptr_t first = 0;  ///< where the block's first piece starts (first_start())
  };
  enum class swap_result { done, undone, no_access, broken };

  /// Of the `scan` smallest cached blocks of at least `size` bytes (pointer aligned
  /// to `alignment`, as it is or once its first piece moves: first_start(), the plan
  /// saying where it starts), the one whose first `size` bytes have the fewest chunks that
  /// cannot be claimed on stream s (at most `max_chunks`), whose work before its free
  /// is done, and that `accept(block, plan)` takes; its plan in `best`. Its old
  /// mappings would change now, not in stream order: hence only once that work is
  /// done, and never waiting for it (a stitch anew does not).
  template <class Accept>
  stitch_block* fewest_blocked(std::size_t size, std::uint32_t s, std::size_t scan, std::size_t alignment,
                               std::size_t max_chunks, repair_plan& best, Accept accept) noexcept {
    max_chunks = std::min(max_chunks, repair_max);
    repair_plan cur, moved;
    stitch_block* chosen = nullptr;
    auto it = cache_.lower_bound(size, stitch_capacity_less{});
    for (std::size_t n = 0; it != cache_.end() && n < scan; ++it, ++n) {
      stitch_block& b = *it;
      // Its plan as it is, and with its first piece where first_start() says: the one
      // with fewer chunks to replace first, the other if accept() refuses that one.
      std::array<std::size_t, 2> k{b.pointer % alignment == 0 ? blocked_in(b, size, s, max_chunks, cur) : 0, 0};
      cur.first = b.pieces.front().addr;
      if (const std::uintptr_t at = first_start(b, size, s, alignment); at != cur.first) {
        k[1] = with_first_at(b, at, [&] { return blocked_in(b, size, s, max_chunks, moved); });
        moved.first = at;
      }
      if ((k[0] == 0 && k[1] == 0) || !streams_.done_now(b.tag)) continue;
      const bool moved_first = k[1] != 0 && (k[0] == 0 || k[1] < k[0]);
      for (const bool m : {moved_first, !moved_first}) {
        const std::size_t count = k[m ? 1 : 0];
        repair_plan& plan = m ? moved : cur;
        if (count == 0 || (chosen != nullptr && count >= best.count) || !accept(b, plan)) continue;
        chosen = &b;
        best = plan;
        break;
      }
    }
    return chosen;
  }

  /// Collects the chunks under b's first `size` bytes that cannot be claimed on
  /// stream s, in stitched order. Returns how many: 0 also when there are none or
  /// more than `max`.
  std::size_t blocked_in(const stitch_block& b, std::size_t size, std::uint32_t s, std::size_t max,
                         repair_plan& out) noexcept {
    std::size_t left = size;
    std::uintptr_t va = b.va;
    out.count = 0;
    bool over = false;
    for (std::size_t i = 0; i < b.pieces.size() && left > 0 && !over; ++i) {
      const stitch_piece& p = b.pieces[i];
      const std::size_t len = std::min(left, p.size);
      large_.for_each_chunk(p.addr, p.addr + len, [&](std::uintptr_t c, std::size_t bytes, const auto&) {
        const std::uintptr_t lo = std::max(c, p.addr), hi = std::min(c + bytes, p.addr + len);
        const range& r = large_.holding(lo);
        if (over || (r.is_free() && r.end() >= hi && streams_.usable(r.tag, s))) return;
        if (out.count == max) {
          over = true;
          return;
        }
        const bool edge = c < p.addr || c + bytes > p.end();
        out.chunks[out.count++] = swap{c, va + (c - large_.chunk_floor(p.addr)), bytes, i, edge, {}, 0};
      });
      va += span_bytes(p);
      left -= len;
    }
    return over || left > 0 ? 0 : out.count;
  }

  /// Finds, for each chunk of `plan`, free whole chunks usable on stream s and
  /// outside b whose bytes add up to its bytes (one of the same bytes if there is
  /// one, else the largest that fit), each used once. A chunk at a piece's edge gets
  /// one of the same bytes only: the piece then covers every chunk that replaces it,
  /// so the pieces still tile the reservation. False if one has none.
  bool find_replacements(const stitch_block& b, std::uint32_t s, repair_plan& plan) noexcept {
    std::array<stitch_piece, repair_candidates> free{};
    std::array<bool, repair_candidates> taken{};
    std::size_t n = 0;
    const auto in_b = [&](std::uintptr_t c) {
      for (const auto& p : b.pieces)
        if (c >= large_.chunk_floor(p.addr) && c < large_.chunk_end(p.end() - 1)) return true;
      return false;
    };
    large_.for_each_free_largest([&](const range& r) {
      const auto sp = large_.split_of(r);
      if (sp.whole == 0 || !streams_.usable(r.tag, s)) return true;
      const std::uintptr_t lo = r.addr + sp.head;
      large_.for_each_chunk(lo, lo + sp.whole, [&](std::uintptr_t c, std::size_t bytes, const auto&) {
        if (n < free.size() && !in_b(c)) free[n++] = {c, bytes};
      });
      return n < free.size();
    });
    for (std::size_t k = 0; k < plan.count; ++k) {
      swap& w = plan.chunks[k];
      w.fresh_count = 0;
      for (std::size_t left = w.bytes; left > 0;) {
        std::size_t pick = n;
        for (std::size_t i = 0; i < n; ++i) {
          if (taken[i] || free[i].size > left) continue;
          if (pick == n || free[i].size > free[pick].size) pick = i;
          if (free[i].size == left) break;
        }
        if (pick == n || w.fresh_count == repair_fresh_max || (w.edge && free[pick].size != w.bytes)) return false;
        taken[pick] = true;
        w.fresh[w.fresh_count++] = free[pick];
        left -= free[pick].size;
      }
    }
    return true;
  }

  /// Maps w's replacements in b in place of its old chunk. done: replaced; undone:
  /// b is as it was; no_access: b is as it was but the old chunk has no access set
  /// (b can only be unmapped); broken: the old chunk is unmapped and w.fresh_count
  /// says how many replacements stay mapped in its place (the rest is a hole).
  swap_result replace(stitch_block& b, swap& w) noexcept {
    if (backend_.unmap(w.va, w.bytes) != errc::ok) return swap_result::undone;
    std::size_t mapped = 0, k = 0;
    errc e = errc::ok;
    for (; k < w.fresh_count && e == errc::ok; ++k)
      if ((e = backend_.map(w.va + mapped, w.fresh[k].size, large_.chunk_of(w.fresh[k].addr))) == errc::ok)
        mapped += w.fresh[k].size;
    if (e == errc::ok) e = backend_.set_access(w.va, w.bytes);
    if (e == errc::ok) {
      large_.pin(w.old, w.old + w.bytes, -1);
      for (std::size_t i = 0; i < w.fresh_count; ++i) large_.pin(w.fresh[i].addr, w.fresh[i].end(), 1);
      return swap_result::done;
    }
    // Undo: the replacements out, the old chunk back.
    if (mapped != 0 && backend_.unmap(w.va, mapped) != errc::ok) {
      ++held_.failed_cleanups;
      std::size_t i = 0;
      for (std::size_t at = 0; at < mapped; at += w.fresh[i++].size) large_.pin(w.fresh[i].addr, w.fresh[i].end(), 1);
      w.fresh_count = i;  // these stay mapped; the rest of the old chunk's bytes is a hole
      return broken(b, w, mapped);
    }
    if (backend_.map(w.va, w.bytes, large_.chunk_of(w.old)) != errc::ok) {
      ++held_.failed_cleanups;
      w.fresh_count = 0;
      return broken(b, w, 0);
    }
    if (backend_.set_access(w.va, w.bytes) == errc::ok) return swap_result::undone;
    ++held_.failed_cleanups;
    return swap_result::no_access;
  }
  swap_result broken(stitch_block& b, const swap& w, std::size_t mapped) noexcept {
    large_.pin(w.old, w.old + w.bytes, -1);
    b.hole_at = w.va + mapped - b.va;
    b.hole_bytes = w.bytes - mapped;
    return swap_result::broken;
  }

  /// The pieces of b with each chunk of `swaps` (in stitched order) replaced: the
  /// bytes of a piece under such a chunk come from its replacements at the same
  /// offsets (bytes past the replacements, a hole, are left out). Into `out`, whose
  /// capacity suffices.
  void relay(const stitch_block& b, std::span<const swap> swaps, std::vector<stitch_piece>& out) const noexcept {
    out.clear();
    std::size_t j = 0;
    for (std::size_t i = 0; i < b.pieces.size(); ++i) {
      const stitch_piece& p = b.pieces[i];
      std::uintptr_t at = p.addr;
      for (; j < swaps.size() && swaps[j].piece == i; ++j) {
        const swap& w = swaps[j];
        const std::uintptr_t lo = std::max(w.old, p.addr), hi = std::min(w.old + w.bytes, p.end());
        if (lo > at) out.push_back({at, lo - at});
        std::size_t o = 0;  // offset of replacement k in the old chunk
        for (std::size_t k = 0; k < w.fresh_count; o += w.fresh[k++].size) {
          const std::size_t from = std::max(o, lo - w.old), to = std::min(o + w.fresh[k].size, hi - w.old);
          if (to > from) out.push_back({w.fresh[k].addr + (from - o), to - from});
        }
        at = hi;
      }
      if (at < p.end()) out.push_back({at, p.end() - at});
    }
  }

  /// The bytes from b's pointer that are free and usable on stream s, counted until
  /// they reach `size` or one is not, and how many of b's pieces hold them.
  struct free_prefix {
    std::size_t bytes = 0, pieces = 0;
  };
  [[nodiscard]] free_prefix prefix(const stitch_block& b, std::size_t size, std::uint32_t s) const noexcept {
    free_prefix out;
    for (const auto& p : b.pieces) {
      if (out.bytes >= size) break;
      const range& r = large_.holding(p.addr);
      if (!r.is_free() || !streams_.usable(r.tag, s)) break;
      const std::size_t len = std::min(p.size, static_cast<std::size_t>(r.end() - p.addr));
      out.bytes += len;
      ++out.pieces;
      if (len < p.size) break;
    }
    return out;
  }

  /// How many of b's pieces hold its first `size` bytes, if those are all free and
  /// usable on stream s; 0 if not.
  [[nodiscard]] std::size_t claimable(const stitch_block& b, std::size_t size, std::uint32_t s) const noexcept {
    const free_prefix f = prefix(b, size, s);
    return size != 0 && f.bytes >= size ? f.pieces : 0;
  }

  /// f(), with b's first piece starting at `at` meanwhile; b is as it was after.
  template <class F>
  auto with_first_at(stitch_block& b, std::uintptr_t at, F&& f) noexcept {
    stitch_piece& first = b.pieces.front();
    const stitch_piece was = first;
    first = {at, was.end() - at};
    const auto result = f();
    first = was;
    return result;
  }

  /// Where cached block b's first piece can start for a request of `size` bytes on
  /// stream s, within the piece's first chunk, with the pointer aligned to
  /// `alignment` and at least `size` bytes left in the block. Let F be the free range
  /// (usable on s) that holds the piece's last byte. Bytes at the piece's start taken
  /// since (F starts after it): the piece starts where F does. Bytes taken further on
  /// (F starts before it): the piece starts earlier, by what the request lacks, but
  /// not before F, nor over another piece of b in that chunk. Else, or if F is not
  /// free: where it starts now. A block maps its first piece's chunks whole, so the
  /// bytes before that piece are mapped in it already: moving the start makes no
  /// driver call, and the request then needs more or fewer bytes of the later pieces.
  /// This is what a layer loop needs whose live bytes drift: each layer's free bytes
  /// start and end a little earlier (or later) than the last one's.
  [[nodiscard]] std::uintptr_t first_start(const stitch_block& b, std::size_t size, std::uint32_t s,
                                           std::size_t alignment) const noexcept {
    const stitch_piece& p = b.pieces.front();
    const range& r = large_.holding(p.end() - 1);
    if (!slide_ || !r.is_free() || !streams_.usable(r.tag, s)) return p.addr;
    const std::uintptr_t floor = large_.chunk_floor(p.addr);
    std::uintptr_t at = std::max(r.addr, floor);
    if (at < p.addr) {
      for (std::size_t i = 1; i < b.pieces.size(); ++i)  // the last piece may end in this chunk
        if (b.pieces[i].addr < p.addr && b.pieces[i].end() > at) at = b.pieces[i].end();
    }
    at = floor + round_up(at - floor, alignment);
    if (at == p.addr || at >= large_.chunk_end(p.addr) || at >= p.end() || b.capacity + p.addr - at < size)
      return p.addr;
    if (at < p.addr) {  // back by no more than the request lacks
      const std::size_t got = prefix(b, size, s).bytes;
      if (got >= size) return p.addr;
      at = p.addr - std::min(p.addr - at, round_up(size - got, alignment));
    }
    return (b.va + (at - floor)) % alignment == 0 ? at : p.addr;
  }

  /// Cached block b's first piece starts at `at` (first_start()): its capacity and
  /// pointer change, and with them its place in the cache and the pointer index. Its
  /// mapping, the chunks it pins and its place in the LRU do not.
  void move_first(stitch_block& b, std::uintptr_t at) noexcept {
    stitch_piece& p = b.pieces.front();
    cache_.erase(cache_.iterator_to(b));
    by_pointer_.erase(by_pointer_.iterator_to(b));
    b.capacity = b.capacity + p.addr - at;
    b.pointer = b.pointer + at - p.addr;
    p = {at, p.end() - at};
    cache_.insert(b);
    [[maybe_unused]] const bool fresh = by_pointer_.insert(b).second;
    GMLAKE_ASSERT(fresh, "a moved block's pointer is another block's");
  }

  /// Bytes of the chunks that hold piece p (what a stitch maps for it).
  [[nodiscard]] std::size_t span_bytes(const stitch_piece& p) const noexcept {
    return large_.chunk_end(p.end() - 1) - large_.chunk_floor(p.addr);
  }

  /// Puts an inactive block into the cache (by capacity) and at the LRU's end.
  void cache(stitch_block& b) noexcept {
    b.last_use = ++clock_;
    b.cached = true;
    cache_.insert(b);
    lru_.push_back(b);
    cached_bytes_ += b.mapped;
  }
  /// Takes a block out of the cache and the LRU.
  void uncache(stitch_block& b) noexcept {
    cache_.erase(cache_.iterator_to(b));
    lru_.erase(lru_.iterator_to(b));
    cached_bytes_ -= b.mapped;
    b.cached = false;
  }

  static stitch_info entry_at(const void* self, stitch_cache_entries::order o, std::size_t i) noexcept {
    const auto& pool = *static_cast<const stitch_pool*>(self);
    const stitch_block* b = nullptr;
    if (o == stitch_cache_entries::by_age) {
      auto it = pool.lru_.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(i));
      b = &*it;
    } else {
      auto it = pool.cache_.rbegin();
      std::advance(it, static_cast<std::ptrdiff_t>(i));
      b = &*it;
    }
    return {b->mapped, b->last_use, b->pointer};
  }

  /// Unmaps b and frees its reservation, after its stream work is done. `force`:
  /// also a block in use, and whatever the backend says (the allocator is going away).
  bool unmap(stitch_block& b, bool force) noexcept {
    if ((b.in_use || hold_) && !force) return false;
    if (!b.in_use && !streams_.wait(b.tag) && !force) return false;  // force: going away, no retry
    // force: nothing can retry later, so retry now, a few times.
    if (retry([&] { return backend_.unmap(b.va, b.mapped); }, force ? close_attempts : 1) != errc::ok) {
      ++held_.failed_cleanups;
      if (!force) return false;  // stays as it is (cached): retried later
    }
    const bool freed = retry([&] { return backend_.address_free(b.va, b.reserved); }, force ? close_attempts : 1) == errc::ok;
    for (const auto& p : b.pieces) large_.pin(p.addr, p.end(), -1);
    if (b.cached) uncache(b);
    if (b.in_use) {
      for (std::size_t i = 0; i < b.claimed_count; ++i) b.claimed[i]->owner = nullptr;
    }
    drop(b);
    if (!freed && !force) {  // unmapped, but the reservation is still held: keep it
      ++held_.failed_cleanups;
      b.in_use = false;
      b.claimed_count = 0;
      b.pending_unmap = 0;
      b.pending_free = true;
      keep(b);
      return true;
    }
    delete &b;
    return true;
  }

  /// Takes b out of the blocks found by pointer and out of the footprint.
  void drop(stitch_block& b) noexcept {
    by_pointer_.erase(by_pointer_.iterator_to(b));
    held_.stitched.sub(1);
    held_.mapped.sub(static_cast<std::int64_t>(b.mapped));
  }

  /// Puts a block given up on into the quarantine list.
  void keep(stitch_block& b) noexcept {
    b.cached = false;
    quarantine_.push_back(b);
    held_.quarantined_stitches.add(1);
  }
  /// Drops a quarantined block.
  void forget(stitch_block& b) noexcept {
    if (b.pending_unmap != 0)
      for (const auto& p : b.pieces) large_.pin(p.addr, p.end(), -1);
    quarantine_.erase(quarantine_.iterator_to(b));
    held_.quarantined_stitches.sub(1);
    delete &b;
  }

  Backend& backend_;
  arena_type& large_;
  stream_table<Backend>& streams_;
  node_pool<range>& nodes_;
  footprint& held_;
  stitch_by_pointer by_pointer_;
  stitch_cache cache_;
  stitch_lru lru_;
  stitch_lru quarantine_;  // blocks given up on whose undo failed (the LRU hook is free in them)
  std::size_t cached_bytes_ = 0;
  std::uint64_t clock_ = 0;
  bool hold_ = false;
  bool slide_ = true;
};

} // namespace gmlake::detail
