// gmlake/detail/stitch_planner.hpp - works out a stitch: which free bytes, in what
// order, and how many new bytes are still missing. Pure: it maps nothing, changes
// no arena, and sees only what it is offered.
//
// The allocator offers the large arena's usable free ranges, largest first, each as
// a stitch_source (its bytes before, of and after whole chunks). A range with whole
// chunks is a candidate for the StitchPolicy to select from; one with none may give
// an edge (the policy's edge_min()): free bytes at a chunk boundary that can open or close
// a stitch. Where chunks end is asked of a chunk_ends function, the only thing the
// planner needs to know of the arena.
//
// All member functions are noexcept and allocate nothing: the candidates and the
// pieces live in the planner, a short-lived object on the caller's stack.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "../concepts.hpp"
#include "stitch_block.hpp"

namespace gmlake::detail {

/// A free range offered to the planner.
struct stitch_source {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t head = 0;        ///< bytes before the first whole chunk
  std::size_t whole = 0;       ///< bytes of whole chunks (0: none)
  std::size_t tail = 0;        ///< bytes after the last whole chunk
  std::uintptr_t boundary = 0; ///< whole == 0: the first chunk boundary at or after addr
  [[nodiscard]] std::uintptr_t end() const noexcept { return addr + size; }
};

/// Where chunks end: `(*this)(p)` is the end of the chunk that holds byte p.
class chunk_ends {
 public:
  using fn = std::uintptr_t (*)(const void* state, std::uintptr_t p) noexcept;
  chunk_ends(const void* state, fn f) noexcept : state_(state), f_(f) {}
  std::uintptr_t operator()(std::uintptr_t p) const noexcept { return f_(state_, p); }

 private:
  const void* state_;
  fn f_;
};

class stitch_planner {
 public:
  /// Candidates offered at most (the largest usable free ranges with whole chunks).
  static constexpr std::size_t max_candidates = 64;

  /// `slot`: the smallest chunk; `edge_min`: the StitchPolicy's (0: no edges);
  /// `chunk_start`: the stitch starts at a chunk boundary (no opening edge, the first
  /// piece without its head), so the block's pointer is its reservation's start:
  /// for aligned requests.
  stitch_planner(std::size_t slot, std::size_t edge_min, chunk_ends ends, bool chunk_start = false) noexcept
      : slot_(slot), edge_min_(edge_min), ends_(ends), chunk_start_(chunk_start) {}
  stitch_planner(const stitch_planner&) = delete;
  stitch_planner& operator=(const stitch_planner&) = delete;

  /// True once max_candidates candidates were offered: offer no more.
  [[nodiscard]] bool full() const noexcept { return n_ == max_candidates; }

  /// Offers a usable free range (largest first). Pre: !full().
  void offer(const stitch_source& r) noexcept {
    if (r.whole != 0) {
      candidates_[n_++] = stitch_candidate{r.addr, r.head, r.whole, r.tail};
      return;
    }
    if (edge_min_ == 0 || r.boundary > r.end()) return;  // no edges, or inside one chunk
    const std::size_t before = r.boundary - r.addr, after = r.end() - r.boundary;
    if (before >= edge_min_ && before > opening_.bytes) opening_ = {r.addr, before};
    if (after >= edge_min_ && after > closing_.bytes) closing_ = {r.boundary, after};
  }

  /// Plans a stitch of `size` bytes from what was offered: the policy selects the
  /// candidates (at most its max_pieces()); edges open or close the stitch where
  /// they give more than the chosen pieces' own head or tail. False when there is
  /// nothing to stitch, or when the pieces fall short and `shortfall` does not allow
  /// new chunks. True: pieces() and fresh() say what to build.
  template <StitchPolicy P>
  [[nodiscard]] bool plan(const P& policy, std::size_t size, bool shortfall) noexcept {
    const std::size_t n = n_;
    const std::span<stitch_candidate> c(candidates_.data(), n);
    const std::size_t k = n ? policy.select(c, size) : 0;
    if (k > n || k > policy.max_pieces() || (k == 0 && (n != 0 || opening_.bytes + closing_.bytes == 0)))
      return false;
    std::size_t got = 0, m = 0;
    bool tail_taken = false;
    closing_edge_ = false;
    // Lay the pieces out: the first may start at its head (or an opening edge goes
    // first), the last may end at its tail (or a closing edge goes last). Edges
    // only where the pieces fall short: each maps one more chunk.
    const auto lay_out = [&](bool open_edge) {
      got = m = 0;
      tail_taken = false;
      if (open_edge) {
        pieces_[m++] = {opening_.addr, std::min(opening_.bytes, size)};
        got += pieces_[0].size;
      }
      for (std::size_t i = 0; i < k && got < size; ++i) {
        const auto& x = c[i];
        std::uintptr_t lo = x.addr + x.head;
        std::size_t len = x.whole;
        if (i == 0 && !open_edge && !chunk_start_) {
          lo = x.addr;
          len += x.head;
        }
        if (!shortfall && i + 1 == k) {
          len += x.tail;
          tail_taken = x.tail > 0;
        }
        if (got + len > size) {  // the last piece: only the chunks the request needs
          const std::uintptr_t end = ends_(lo + (size - got) - 1);
          len = std::min<std::size_t>(len, end - lo);
        }
        pieces_[m++] = {lo, len};
        got += len;
      }
    };
    lay_out(false);
    if (got < size && !chunk_start_ && opening_.bytes > (k ? c[0].head : 0)) {
      const std::size_t short_by = round_up(size - got, slot_);
      lay_out(true);
      if (got < size && round_up(size - got, slot_) >= short_by) lay_out(false);  // it saves no chunk
    }
    if (got < size && tail_taken && closing_.bytes > c[k - 1].tail) {  // the closing edge instead of the tail
      pieces_[m - 1].size -= c[k - 1].tail;
      got -= c[k - 1].tail;
      tail_taken = false;
    }
    if (got < size && closing_.bytes > 0 && !tail_taken) {
      // Without new chunks the edge closes the stitch; with them it follows them,
      // worth it only where it saves a chunk.
      const std::size_t left = size - got, edge = std::min(left, closing_.bytes);
      const std::size_t fresh = round_up(left - edge, slot_);
      if (fresh == 0 || (shortfall && fresh < round_up(left, slot_))) {
        pieces_[m++] = {closing_.addr, edge};
        closing_edge_ = true;
        m_ = m;
        fresh_ = fresh;
        return true;
      }
    }
    m_ = m;
    fresh_ = got < size ? round_up(size - got, slot_) : 0;
    return fresh_ == 0 || (shortfall && m >= 1);
  }

  /// New bytes (whole slots) the planned stitch still needs; 0: none (S3).
  [[nodiscard]] std::size_t fresh() const noexcept { return fresh_; }

  /// The planned pieces, in stitched order.
  [[nodiscard]] std::span<const stitch_piece> pieces() const noexcept { return {pieces_.data(), m_}; }

  /// Puts the fresh() new bytes, created at `at`, into the pieces: after the last
  /// piece, or before a closing edge, which then follows them at their chunk's end
  /// (growth may have created more than fresh(); that surplus then serves first).
  /// Returns the pieces.
  std::span<const stitch_piece> add_fresh(std::uintptr_t at) noexcept {
    // The new bytes were a hole: they overlap no piece, whatever they merged with.
    stitch_piece made{at, fresh_};
    if (closing_edge_) {
      const std::uintptr_t end = ends_(made.end() - 1);
      const std::size_t extra = end - made.end();
      const stitch_piece edge = pieces_[m_ - 1];
      made.size = end - made.addr;
      pieces_[m_ - 1] = made;
      if (edge.size > extra) pieces_[m_++] = {edge.addr, edge.size - extra};
    } else {
      pieces_[m_++] = made;
    }
    return pieces();
  }

 private:
  /// Free bytes at a chunk boundary of a range with no whole chunk: those that end
  /// at one can open a stitch, those that start at one can close it.
  struct stitch_edge {
    std::uintptr_t addr = 0;
    std::size_t bytes = 0;
  };

  std::size_t slot_;
  std::size_t edge_min_;
  chunk_ends ends_;
  std::size_t n_ = 0;       // candidates offered
  std::size_t m_ = 0;       // pieces planned
  std::size_t fresh_ = 0;
  bool closing_edge_ = false;
  bool chunk_start_ = false;
  stitch_edge opening_, closing_;
  std::array<stitch_candidate, max_candidates> candidates_;
  std::array<stitch_piece, max_candidates + 3> pieces_;  // + opening edge, new bytes, closing edge
};

} // namespace gmlake::detail
