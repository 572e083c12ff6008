// tests/test_settings.cpp - parse_settings (gmlake/settings.hpp): what each key
// overrides, the errors, and an allocator built from settings.
#include <doctest/doctest.h>

#include <cstddef>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gmlake/backend/simulated.hpp"
#include "gmlake/configs.hpp"
#include "gmlake/settings.hpp"
#include "support.hpp"

namespace {

using gmlake::parse_settings;
using gmlake::settings;
namespace policy = gmlake::policy;

constexpr std::size_t mib = std::size_t{1} << 20;

std::string error_of(const char* text) {
  try {
    (void)parse_settings(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("settings: nothing set changes nothing") {
  for (const char* text : {"", " ", ",", " , ,"}) {
    const settings s = parse_settings(text);
    CHECK(s == settings{});
    CHECK(s.str().empty());
    const gmlake::options o = s.applied(gmlake::options{});
    CHECK(o.small_max == gmlake::options{}.small_max);
    CHECK(o.repair_chunks == gmlake::options{}.repair_chunks);
    const policy::best_fit_pieces p = s.applied(policy::best_fit_pieces{});
    CHECK(p.edges == policy::best_fit_pieces{}.edges);
    CHECK(p.grow.max_chunk == policy::stitch_growth.max_chunk);
    CHECK(p.grow.floor == policy::stitch_growth.floor);
  }
}

TEST_CASE("settings: each key sets what it names, in its unit") {
  const settings s = parse_settings(
      "chunk_mib:4, max_chunk_mib:128,big_growth_mib:1024,big_chunk_mib:512,min_growth_mib:8,growth_divisor:1024,"
      "small_growth_divisor:4,small_growth_cap_mib:16,small_max_kib:256,stitch_edges_mib:0,stitch_pieces:32,"
      "cached_scan:16,repair_chunks:8,append_room:2,lend_to_large:false,lend_to_small:true,"
      "settled_max_chunk_mib:96,settled_big_chunk_mib:2048,settle_window:3,settle_divisor:20,borrow_max_mib:16,"
      "request_chunk:false,slide_cached:false");
  const gmlake::options o = s.applied(gmlake::options{});
  CHECK(o.chunk_size == 4 * mib);
  CHECK(o.small_max == 256 * 1024);
  CHECK(o.cached_scan == 16);
  CHECK(o.repair_chunks == 8);
  CHECK(o.append_room == 2);
  CHECK(o.settle_window == 3);
  CHECK(o.settle_divisor == 20);
  CHECK(!o.slide_cached);
  CHECK(gmlake::options{}.slide_cached);
  const policy::best_fit_pieces p = s.applied(policy::best_fit_pieces{});
  CHECK(p.grow.max_chunk == 128 * mib);
  CHECK(p.grow.settled_max_chunk == 96 * mib);
  CHECK(p.grow.settled_big_chunk == 2048 * mib);
  CHECK(p.grow.big_growth == 1024 * mib);
  CHECK(p.grow.big_chunk == 512 * mib);
  CHECK(p.grow.floor == 8 * mib);
  CHECK(p.grow.floor_divisor == 1024);
  CHECK(p.grow.small_divisor == 4);
  CHECK(p.grow.small_cap == 16 * mib);
  CHECK(p.edges == 0);
  CHECK(p.pieces == 32);
  CHECK(!p.grow.lends.to_large);
  CHECK(p.grow.lends.to_small);
  CHECK(p.grow.lends.borrow_max == 16 * mib);
  CHECK(policy::best_fit_pieces{}.grow.lends.borrow_max == 16 * mib);  // the preset's
  CHECK(!p.grow.request_chunk);
  CHECK(policy::best_fit_pieces{}.grow.request_chunk);  // the preset's
  // str() gives the keys back in a form parse_settings reads to the same settings.
  CHECK(parse_settings(s.str()) == s);
  CHECK(s.str().find("stitch_edges_mib:0") != std::string::npos);
}

TEST_CASE("settings: the floor and big chunks leave a policy that grows exactly alone") {
  const settings s = parse_settings(
      "min_growth_mib:64,big_growth_mib:64,big_chunk_mib:512,max_chunk_mib:64,settled_big_chunk_mib:512,"
      "settled_max_chunk_mib:128");
  const policy::no_stitch bfc = s.applied(policy::no_stitch{});
  CHECK(bfc.grow.floor == 0);
  CHECK(bfc.grow.big_growth == 0);
  CHECK(bfc.grow.settled_big_chunk == 0);
  CHECK(bfc.grow.max_chunk == 64 * mib);  // chunk sizes apply everywhere
  CHECK(bfc.grow.settled_max_chunk == 128 * mib);
  const policy::best_fit_pieces g = s.applied(policy::best_fit_pieces{});
  CHECK(g.grow.floor == 64 * mib);
  CHECK(g.grow.big_chunk == 512 * mib);
}

TEST_CASE("settings: spaces are ignored and a key given twice takes its last value") {
  const settings s = parse_settings("  max_chunk_mib : 64 ,\tmax_chunk_mib:128, lend_to_small: 1 ,lend_to_large:False\n");
  CHECK(s.max_chunk == 128 * mib);
  CHECK(s.lend_to_small == true);
  CHECK(s.lend_to_large == false);
  CHECK(s.str() == "max_chunk_mib:128,lend_to_large:false,lend_to_small:true");
  CHECK(parse_settings("lend_to_small:True").lend_to_small == true);
}

TEST_CASE("settings: bad input is refused with the item and the reason") {
  CHECK(error_of("max_chunk_mb:64").find("'max_chunk_mb:64': unknown key (keys: chunk_mib,") != std::string::npos);
  CHECK(error_of("max_chunk_mib").find("expected key:value") != std::string::npos);
  CHECK(error_of("max_chunk_mib:").find("expected a whole number") != std::string::npos);
  CHECK(error_of("max_chunk_mib:-1").find("expected a whole number") != std::string::npos);
  CHECK(error_of("max_chunk_mib:64k").find("expected a whole number") != std::string::npos);
  CHECK(error_of("max_chunk_mib:1.5").find("expected a whole number") != std::string::npos);
  CHECK(error_of("max_chunk_mib:99999999999999999999999").find("at most 1073741824") != std::string::npos);
  CHECK(error_of("stitch_pieces:0").find("'stitch_pieces:0': at least 1") != std::string::npos);
  CHECK(error_of("max_chunk_mib:1073741825").find("at most 1073741824") != std::string::npos);
  CHECK(error_of("repair_chunks:9").find("'repair_chunks:9': at most 8") != std::string::npos);
  CHECK(error_of("append_room:17").find("at most 16") != std::string::npos);
  CHECK(error_of("small_max_kib:2048").find("at most 1024") != std::string::npos);
  CHECK(error_of("lend_to_small:yes").find("expected true or false") != std::string::npos);
  CHECK(error_of("stitch_edges_mib:0,bogus:1").find("'bogus:1'") != std::string::npos);
  CHECK(error_of("max_chunk_mib:64") == "");
}

TEST_CASE("settings: an allocator built from them grows in the chunks they say") {
  using A = gmlake::gmlake_allocator<gmlake::backend::simulated>;
  const auto creates_for = [](const char* text, std::size_t bytes) {
    const settings s = parse_settings(text);
    A a(gmlake::backend::simulated(std::size_t{64} << 30), s.applied(gmlake::options{}),
        s.applied(policy::best_fit_pieces{}));
    void* p = a.allocate(bytes);
    const auto made = a.stats().calls[static_cast<std::size_t>(gmlake::call::create)];
    a.deallocate(p, bytes);
    gmlake_test::check_released(a);
    return made;
  };
  CHECK(creates_for("", 200 * mib) == 7);                  // 32 MiB chunks: 6 x 32 + 8
  CHECK(creates_for("max_chunk_mib:128", 200 * mib) == 2);  // 128 + 72
  CHECK(creates_for("max_chunk_mib:0", 20 * mib) >= 8);    // one 2 MiB slot per chunk, floor included
}

TEST_CASE("settings: every key at its extremes keeps the allocator sound") {
  using A = gmlake::gmlake_allocator<gmlake::backend::simulated>;
  for (const char* text :
       {"max_chunk_mib:0,min_growth_mib:0,growth_divisor:0,big_growth_mib:0", "max_chunk_mib:1024,big_chunk_mib:0",
        "big_growth_mib:1,big_chunk_mib:1024,min_growth_mib:1024,growth_divisor:1",
        "small_max_kib:0,small_growth_divisor:1,small_growth_cap_mib:0", "small_max_kib:1024,small_growth_divisor:0",
        "stitch_pieces:1,stitch_edges_mib:0,cached_scan:0,repair_chunks:0,append_room:0",
        "stitch_pieces:65536,stitch_edges_mib:1,cached_scan:1,repair_chunks:8,append_room:16",
        "chunk_mib:8,lend_to_large:false,lend_to_small:true", "chunk_mib:0,lend_to_large:true,lend_to_small:false",
        "borrow_max_mib:2,settle_window:1,settle_divisor:1", "borrow_max_mib:1024,settle_window:1,settle_divisor:1,lend_to_small:true",
        "settle_window:1,settle_divisor:1,settled_max_chunk_mib:1024,settled_big_chunk_mib:1024",
        "settle_window:64,settle_divisor:65536,settled_max_chunk_mib:0,settled_big_chunk_mib:0", "settle_window:0"}) {
    CAPTURE(text);
    const settings s = parse_settings(text);
    // 512 MiB: near capacity, so requests stitch, grow, and some fail (S5).
    A a(gmlake::backend::simulated(std::size_t{512} << 20), s.applied(gmlake::options{}),
        s.applied(policy::best_fit_pieces{}));
    std::mt19937 rng(7);
    std::vector<std::pair<void*, std::size_t>> live;
    for (int i = 0; i < 3000; ++i) {
      if (!live.empty() && rng() % 5 < 2) {
        const std::size_t k = rng() % live.size();
        a.deallocate(live[k].first, live[k].second);
        live[k] = live.back();
        live.pop_back();
        continue;
      }
      // Sizes from 1 B to 64 MiB, log-uniform, so both arenas grow, split and stitch.
      const std::size_t base = std::size_t{1} << (rng() % 27), bytes = base + rng() % base;
      if (void* p = a.try_allocate(bytes)) live.emplace_back(p, bytes);
    }
    CHECK(a.check_invariants());
    CHECK(live.size() > 100);  // most requests were served
    if (s.borrow_max) CHECK(a.stats().borrowed_bytes > 0);
    for (auto [p, n] : live) a.deallocate(p, n);
    gmlake_test::check_released(a);
  }
}
