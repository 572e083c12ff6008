// gmlake/policy/stitch.hpp - StitchPolicy models: whether, how and when to stitch.
//
// The allocator offers the largest usable free ranges as candidates (largest
// first); a policy picks the pieces and their order. Only whole chunks are
// stitched: the first piece may also bring its head (bytes before its first chunk
// boundary), the last its tail. A policy that returns pieces short of `need`
// leaves the rest to S4 (new chunks), if `create_shortfall()` allows it.
//
// Each model also carries its S4 part: where new chunks go (create_shortfall) and
// its growth_rules (policy/growth.hpp): how many bytes, in what chunks, and when
// free chunks move between the arenas.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

#include "../concepts.hpp"
#include "growth.hpp"

namespace gmlake::policy {

namespace detail_stitch {
/// Puts the piece with the largest head first and, of the others, the one with the
/// largest tail last, so the stitch uses as many of the edge bytes as it can.
inline void order_edges(std::span<stitch_candidate> c, std::size_t k) noexcept {
  if (k < 2) return;
  auto first = std::max_element(c.begin(), c.begin() + k,
                                [](const auto& a, const auto& b) { return a.head < b.head; });
  std::iter_swap(c.begin(), first);
  auto last = std::max_element(c.begin() + 1, c.begin() + k,
                               [](const auto& a, const auto& b) { return a.tail < b.tail; });
  std::iter_swap(c.begin() + (k - 1), last);
}
} // namespace detail_stitch

/// Stitching off: the allocator is a plain best-fit caching allocator with
/// coalescing, each new segment created whole. This is the `bfc` baseline.
struct no_stitch {
  growth_rules grow = exact_growth;

  bool stitches(std::size_t) const noexcept { return false; }
  std::size_t max_pieces() const noexcept { return 0; }
  std::size_t select(std::span<stitch_candidate>, std::size_t) const noexcept { return 0; }
  std::size_t edge_min() const noexcept { return 0; }
  bool create_shortfall() const noexcept { return false; }
  growth_plan growth(const growth_view& v) const noexcept { return grow.plan(v); }
  lending lends() const noexcept { return grow.lends; }
};
static_assert(StitchPolicy<no_stitch>);

/// No stitching, but growth extends a free range at its end (or start) by the
/// shortfall only: PyTorch's expandable segments on one address range.
struct expand_only : no_stitch {
  bool create_shortfall() const noexcept { return true; }
};
static_assert(StitchPolicy<expand_only>);

/// Fewest pieces (GMLake's largest first): take the largest candidates until the
/// need is covered, at most `pieces` of them.
struct largest_first {
  std::size_t min_bytes = 0;     ///< stitch only requests of at least this size
  std::size_t pieces = 16;       ///< cap on pieces per stitch
  bool shortfall = true;         ///< S4 creates only the missing chunks
  std::size_t edges = 0;         ///< edge_min() (0: no stitch edges)
  growth_rules grow = stitch_growth;

  bool stitches(std::size_t bytes) const noexcept { return bytes >= min_bytes; }
  std::size_t max_pieces() const noexcept { return pieces; }
  std::size_t edge_min() const noexcept { return edges; }
  bool create_shortfall() const noexcept { return shortfall; }
  growth_plan growth(const growth_view& v) const noexcept { return grow.plan(v); }
  lending lends() const noexcept { return grow.lends; }

  std::size_t select(std::span<stitch_candidate> c, std::size_t need) const noexcept {
    const std::size_t n = std::min(c.size(), pieces);
    std::partial_sort(c.begin(), c.begin() + n, c.end(),
                      [](const auto& a, const auto& b) { return a.whole > b.whole; });
    std::size_t k = 0, got = 0;
    while (k < n && got < need) got += c[k++].whole;
    detail_stitch::order_edges(c, k);
    return k;
  }
};
static_assert(StitchPolicy<largest_first>);

/// The public GMLake code's configuration: largest pieces first, only requests of
/// at least 512 MiB, no cap on pieces to speak of, no shortfall path (new memory is
/// a whole new segment, as large as the request), exact growth.
struct gmlake_paper : largest_first {
  constexpr gmlake_paper() noexcept : largest_first{std::size_t{512} << 20, std::size_t{1} << 16, false, 0, exact_growth} {}
};
static_assert(StitchPolicy<gmlake_paper>);

/// Best-fitting last piece: take the largest candidates while none of them covers
/// what is left on its own; then close with the smallest one that does. Keeps large
/// free ranges whole for later requests and overshoots the least. Stitch edges of
/// at least 4 MiB: the free bytes at the end of a partly used chunk may open a
/// stitch, those at the start of one close it, where the pieces fall short
/// (docs/design.md, "Stitch edges").
struct best_fit_pieces {
  std::size_t min_bytes = 0;                ///< stitch only requests of at least this size
  std::size_t pieces = 16;                  ///< cap on pieces per stitch
  bool shortfall = true;                    ///< S4 creates only the missing chunks
  std::size_t edges = std::size_t{4} << 20; ///< edge_min() (0: no stitch edges)
  growth_rules grow = stitch_growth;

  bool stitches(std::size_t bytes) const noexcept { return bytes >= min_bytes; }
  std::size_t max_pieces() const noexcept { return pieces; }
  std::size_t edge_min() const noexcept { return edges; }
  bool create_shortfall() const noexcept { return shortfall; }
  growth_plan growth(const growth_view& v) const noexcept { return grow.plan(v); }
  lending lends() const noexcept { return grow.lends; }

  std::size_t select(std::span<stitch_candidate> c, std::size_t need) const noexcept {
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.whole > b.whole; });
    std::size_t k = 0, got = 0;
    while (k < c.size() && k < pieces && got < need) {
      const std::size_t left = need - got;
      // The smallest remaining candidate that closes the stitch (the list is sorted
      // by size descending, so scan from the back of what is left).
      std::size_t close = c.size();
      for (std::size_t i = c.size(); i-- > k;) {
        if (c[i].whole + c[i].tail >= left) { close = i; break; }
      }
      if (close != c.size()) {
        std::swap(c[k], c[close]);
        // keep the rest sorted for a later call: only order matters among the chosen
        got += c[k++].whole;
        break;
      }
      got += c[k++].whole;
    }
    detail_stitch::order_edges(c, k);
    return k;
  }
};
static_assert(StitchPolicy<best_fit_pieces>);

} // namespace gmlake::policy
