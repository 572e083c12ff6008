// gmlake/settings.hpp - the default rules' overrides, written as a user writes them:
// "key:value,key:value" (GMLAKE_ALLOC_CONF in the PyTorch integration, --settings
// in gmlake-replay and gmlake-gpu-replay).
//
// The defaults are chosen for memory: the fewest bytes reserved over the traces of
// bench/traces. A job that stitches anew after warm-up pays about 25 us of driver
// time per chunk mapped (H200); larger chunks and no stitch edges map fewer chunks
// and reserve more. docs/benchmarks.md ("Settings") measures that trade per trace.
//
//   auto s = gmlake::parse_settings("max_chunk_mib:128,big_chunk_mib:512,stitch_edges_mib:0");
//   gmlake::allocator<gmlake::backend::cuda_vmm> a(gmlake::backend::cuda_vmm(0), s.applied(gmlake::options{}),
//                                                  s.applied(gmlake::policy::best_fit_pieces{}));
//
// Keys (unset: the policy's value; the defaults given are those of the default
// configuration, best_fit_pieces with stitch_growth; sizes in the unit their name gives):
//   chunk_mib             smallest chunk, the arenas' slot (the granularity; at most 1024)
//   max_chunk_mib         largest chunk a growth of the large arena creates (32)
//   big_growth_mib        a growth of at least this many bytes ... (768)
//   big_chunk_mib         ... creates chunks of up to this size (256)
//   settled_max_chunk_mib once the job has settled, max_chunk_mib is at least this (64)
//   settled_big_chunk_mib ... and big_chunk_mib at least this (1024)
//   request_chunk         a growth that one request fills is one chunk once the job
//                         has settled, or when it is a big growth (true)
//   settle_window         the job is judged settled each time it has asked for this
//                         many times its reserved bytes (2; 0: never settled) ...
//   settle_divisor        ... if they grew by at most 1/this since the last time (50)
//   min_growth_mib        a growth creates at least this many bytes (16) ...
//   growth_divisor        ... and at least reserved / this (512; 0: no such term)
//   small_growth_divisor  the small arena grows by its reserved bytes / this (8; 0: one slot)
//   small_growth_cap_mib  ... at most this much at once (8; 0: no cap)
//   small_max_kib         requests up to this size go to the small arena (1024; at most 1024)
//   stitch_edges_mib      smallest free bytes of a partly used chunk a stitch uses (4; 0: none)
//   stitch_pieces         most free ranges one stitch maps (16; 1 to 65536)
//   cached_scan           cached stitched blocks tried per request (8; at most 65536)
//   repair_chunks         chunks of a cached stitched block that may be replaced (4; at most 8)
//   slide_cached          a cached stitched block's first piece may start elsewhere in its
//                         first chunk, over free bytes it maps already (true)
//   append_room           address space each stitched block keeps for appends, in
//                         multiples of its mapping (1; at most 16)
//   lend_to_large         free small-arena chunks are released before the large arena
//                         grows past its peak (true)
//   lend_to_small         and the other way (false)
//   borrow_max_mib        once settled, instead of growing past the peak, the small arena
//                         maps a free whole chunk of the large arena of at most this
//                         size (16 for the stitching policies; 0: never)
// min_growth_mib, growth_divisor, big_growth_mib, big_chunk_mib and
// settled_big_chunk_mib apply to policies that grow with a floor (the stitching
// ones): the others keep growing the large arena by exactly what a request needs.
// max_chunk_mib, settled_max_chunk_mib, request_chunk, the small arena's growth and
// lending apply to every policy (request_chunk is off in the non-stitching ones'
// rules; set there, it applies once settled, as they have no big_growth);
// stitch_edges_mib and stitch_pieces where the policy has them.
//
// Errors: parse_settings throws std::invalid_argument naming the item (an unknown
// key, a value that is not a whole number or a boolean, one out of range). Spaces
// and line ends around keys and values are ignored, empty items skipped; a key given
// twice takes its last value. Booleans: true, True, 1, false, False, 0.
#pragma once

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "allocator.hpp"
#include "policy/growth.hpp"

namespace gmlake {

/// Overrides of an allocator's options and its policy's growth rules; each unset
/// member keeps what it overrides.
struct settings {
  std::optional<std::size_t> chunk, max_chunk, big_growth, big_chunk, floor, floor_divisor;
  std::optional<std::size_t> settled_max_chunk, settled_big_chunk, settle_window, settle_divisor;
  std::optional<std::size_t> small_divisor, small_cap, small_max, edges, pieces;
  std::optional<std::size_t> cached_scan, repair_chunks, append_room;
  std::optional<bool> lend_to_large, lend_to_small, request_chunk, slide_cached;
  std::optional<std::size_t> borrow_max;

  /// `o` with the options set here.
  [[nodiscard]] options applied(options o) const noexcept {
    if (chunk) o.chunk_size = *chunk;
    if (small_max) o.small_max = *small_max;
    if (cached_scan) o.cached_scan = *cached_scan;
    if (repair_chunks) o.repair_chunks = *repair_chunks;
    if (append_room) o.append_room = *append_room;
    if (slide_cached) o.slide_cached = *slide_cached;
    if (settle_window) o.settle_window = *settle_window;
    if (settle_divisor) o.settle_divisor = *settle_divisor;
    return o;
  }

  /// Policy `p` (a StitchPolicy with a `grow` member) with the rules set here.
  template <class Policy>
    requires requires(Policy q) { q.grow.max_chunk; }
  [[nodiscard]] Policy applied(Policy p) const noexcept {
    policy::growth_rules& g = p.grow;
    if (max_chunk) g.max_chunk = *max_chunk;
    if (settled_max_chunk) g.settled_max_chunk = *settled_max_chunk;
    if (g.floor != 0 || g.floor_divisor != 0) {
      if (floor) g.floor = *floor;
      if (floor_divisor) g.floor_divisor = *floor_divisor;
      if (big_growth) g.big_growth = *big_growth;
      if (big_chunk) g.big_chunk = *big_chunk;
      if (settled_big_chunk) g.settled_big_chunk = *settled_big_chunk;
    }
    if (small_divisor) g.small_divisor = *small_divisor;
    if (small_cap) g.small_cap = *small_cap;
    if (lend_to_large) g.lends.to_large = *lend_to_large;
    if (lend_to_small) g.lends.to_small = *lend_to_small;
    if (request_chunk) g.request_chunk = *request_chunk;
    if (borrow_max) g.lends.borrow_max = *borrow_max;
    if constexpr (requires { p.edges; })
      if (edges) p.edges = *edges;
    if constexpr (requires { p.pieces; })
      if (pieces) p.pieces = *pieces;
    return p;
  }

  /// The keys set, in the form parse_settings reads ("" when none is): sizes in
  /// their key's unit, rounded down (what parse_settings sets round-trips).
  [[nodiscard]] std::string str() const;

  friend bool operator==(const settings&, const settings&) = default;
};

namespace detail_settings {

using number_member = std::optional<std::size_t> settings::*;
using flag_member = std::optional<bool> settings::*;

struct key {
  std::string_view name;
  std::size_t unit;      ///< bytes per unit of the value; 0: a boolean
  std::size_t least;     ///< the smallest value accepted, in the key's unit
  std::size_t most;      ///< the largest value accepted, in the key's unit
  number_member number;  ///< the member a number sets (flag: nullptr)
  flag_member flag;      ///< the member a boolean sets (number: nullptr)
};

inline constexpr std::size_t kib = std::size_t{1} << 10, mib = std::size_t{1} << 20;
/// 1 PiB in MiB; with a 32-bit size_t, what fits (parse_settings checks the product).
inline constexpr std::size_t most_mib = sizeof(std::size_t) >= 8 ? std::size_t{1} << 30 : std::size_t{4095};
inline constexpr std::array<key, 23> keys = {{
    {"chunk_mib", mib, 0, 1024, &settings::chunk, nullptr},
    {"max_chunk_mib", mib, 0, most_mib, &settings::max_chunk, nullptr},
    {"big_growth_mib", mib, 0, most_mib, &settings::big_growth, nullptr},
    {"big_chunk_mib", mib, 0, most_mib, &settings::big_chunk, nullptr},
    {"settled_max_chunk_mib", mib, 0, most_mib, &settings::settled_max_chunk, nullptr},
    {"settled_big_chunk_mib", mib, 0, most_mib, &settings::settled_big_chunk, nullptr},
    {"settle_window", 1, 0, 64, &settings::settle_window, nullptr},
    {"settle_divisor", 1, 1, 1 << 16, &settings::settle_divisor, nullptr},
    {"min_growth_mib", mib, 0, most_mib, &settings::floor, nullptr},
    {"growth_divisor", 1, 0, most_mib, &settings::floor_divisor, nullptr},
    {"small_growth_divisor", 1, 0, most_mib, &settings::small_divisor, nullptr},
    {"small_growth_cap_mib", mib, 0, most_mib, &settings::small_cap, nullptr},
    {"small_max_kib", kib, 0, 1024, &settings::small_max, nullptr},
    {"stitch_edges_mib", mib, 0, most_mib, &settings::edges, nullptr},
    {"stitch_pieces", 1, 1, 1 << 16, &settings::pieces, nullptr},
    {"cached_scan", 1, 0, 1 << 16, &settings::cached_scan, nullptr},
    {"repair_chunks", 1, 0, 8, &settings::repair_chunks, nullptr},
    {"append_room", 1, 0, 16, &settings::append_room, nullptr},
    {"lend_to_large", 0, 0, 1, nullptr, &settings::lend_to_large},
    {"lend_to_small", 0, 0, 1, nullptr, &settings::lend_to_small},
    {"request_chunk", 0, 0, 1, nullptr, &settings::request_chunk},
    {"slide_cached", 0, 0, 1, nullptr, &settings::slide_cached},
    {"borrow_max_mib", mib, 0, most_mib, &settings::borrow_max, nullptr},
}};

inline std::string_view trim(std::string_view s) noexcept {
  constexpr std::string_view space = " \t\r\n";
  while (!s.empty() && space.find(s.front()) != std::string_view::npos) s.remove_prefix(1);
  while (!s.empty() && space.find(s.back()) != std::string_view::npos) s.remove_suffix(1);
  return s;
}

[[noreturn]] inline void reject(std::string_view item, const std::string& why) {
  throw std::invalid_argument("gmlake settings: '" + std::string(item) + "': " + why);
}

inline std::string key_list() {
  std::string s;
  for (const key& k : keys) {
    if (!s.empty()) s += ", ";
    s += k.name;
  }
  return s;
}

} // namespace detail_settings

/// @brief Reads "key:value,key:value" (the keys at the top of this header).
/// @throws std::invalid_argument naming the item that is wrong and why.
[[nodiscard]] inline settings parse_settings(std::string_view text) {
  using namespace detail_settings;
  settings s;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) reject(item, "expected key:value");
    const std::string_view name = trim(item.substr(0, colon)), value = trim(item.substr(colon + 1));
    const key* k = nullptr;
    for (const key& c : keys)
      if (c.name == name) k = &c;
    if (k == nullptr) reject(item, "unknown key (keys: " + key_list() + ")");
    if (k->flag != nullptr) {
      if (value == "true" || value == "True" || value == "1") s.*(k->flag) = true;
      else if (value == "false" || value == "False" || value == "0") s.*(k->flag) = false;
      else reject(item, "expected true or false");
      continue;
    }
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (value.empty() || end != value.data() + value.size() || (ec != std::errc{} && ec != std::errc::result_out_of_range))
      reject(item, "expected a whole number");
    if (ec == std::errc::result_out_of_range || n > k->most) reject(item, "at most " + std::to_string(k->most));
    if (n < k->least) reject(item, "at least " + std::to_string(k->least));
    s.*(k->number) = static_cast<std::size_t>(n) * k->unit;
  }
  return s;
}

inline std::string settings::str() const {
  using namespace detail_settings;
  std::string out;
  for (const key& k : keys) {
    std::string v;
    if (k.flag != nullptr && (this->*(k.flag)).has_value()) v = *(this->*(k.flag)) ? "true" : "false";
    if (k.number != nullptr && (this->*(k.number)).has_value()) v = std::to_string(*(this->*(k.number)) / k.unit);
    if (v.empty()) continue;
    if (!out.empty()) out += ',';
    out.append(k.name).append(":").append(v);
  }
  return out;
}

} // namespace gmlake
