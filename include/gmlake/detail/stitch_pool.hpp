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
// A block whose unmap or address free fails (in a rollback, or when it is given
// up on) is not forgotten: it goes to a quarantine list, its pieces' chunks stay
// pinned while it may still map them, and retry_quarantine() (on the next
// growth, on release_cached()) and close() retry what is left.
//
// All member functions are noexcept; those that can fail say so by value and leave
// the pool as it was (apart from a quarantine). Pre for every call: the caller holds the allocator's lock.
#pragma once

#include <cstddef>
#include <cstdint>
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
        if (retry([&] { return backend_.unmap(b.va, b.pending_unmap); }, attempts) != errc::ok) {
          ++held_.failed_cleanups;
          continue;
        }
        for (const auto& p : b.pieces) large_.pin(p.addr, p.end(), -1);
        b.pending_unmap = 0;
      }
      if (retry([&] { return backend_.address_free(b.va, b.mapped); }, attempts) != errc::ok) {
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
    for (const stitch_block& b : quarantine_) n += b.mapped;
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

  /// Maps the pieces side by side into a new reservation. Returns the new block,
  /// neither in use nor cached, or nullptr (nothing changed).
  [[nodiscard]] stitch_block* build(std::span<const stitch_piece> pieces) noexcept {
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
      const errc u = done > 0 ? backend_.unmap(va.value, done) : errc::ok;  // one call over every mapped chunk
      if (u == errc::ok && backend_.address_free(va.value, mapped) == errc::ok) {
        delete b;
        return nullptr;
      }
      ++held_.failed_cleanups;
      b->va = va.value;
      b->mapped = mapped;
      b->pending_unmap = u == errc::ok ? 0 : done;
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
    b->pointer = va.value + (pieces.front().addr - large_.chunk_floor(pieces.front().addr));
    by_pointer_.insert(*b);
    held_.stitched.add(1);
    held_.mapped.add(static_cast<std::int64_t>(mapped));
    return b;
  }

  /// Claims the arena ranges under b's first `size` bytes, if all are free and
  /// usable on stream s; b is then in use (and out of the cache).
  [[nodiscard]] bool claim(stitch_block& b, std::size_t size, std::size_t requested, std::uint32_t s) noexcept {
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
    const bool freed = retry([&] { return backend_.address_free(b.va, b.mapped); }, force ? close_attempts : 1) == errc::ok;
    for (const auto& p : b.pieces) large_.pin(p.addr, p.end(), -1);
    if (b.cached) uncache(b);
    if (b.in_use) {
      for (std::size_t i = 0; i < b.claimed_count; ++i) b.claimed[i]->owner = nullptr;
    }
    by_pointer_.erase(by_pointer_.iterator_to(b));
    held_.stitched.sub(1);
    held_.mapped.sub(static_cast<std::int64_t>(b.mapped));
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
};

} // namespace gmlake::detail
