// tests/test_capture.cpp - capture mode (CUDA graph capture) and the layout walk
// behind memory snapshots.
#include <gmlake/gmlake.hpp>
#include <gmlake/backend/host_memfd.hpp>
#include <doctest/doctest.h>

#include "support.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

using gmlake::call;
using gmlake::backend::counting;
using gmlake::backend::host_memfd;

constexpr gmlake::host_stream s1{1}, s2{2};
constexpr std::size_t C = 64 * 1024;  // host_memfd's chunk here
constexpr std::size_t cap = 256 * C;

/// A small arena for requests up to 16 KiB only (the slots here are small).
gmlake::options opts() {
  gmlake::options o;
  o.small_max = 16 * 1024;
  return o;
}

/// Growth of one slot per chunk, so that freed blocks are whole chunks a stitch can map.
gmlake::policy::best_fit_pieces one_slot() {
  gmlake::policy::best_fit_pieces p;
  p.grow.max_chunk = 0;
  p.grow.small_divisor = 0;
  return p;
}

std::uint64_t calls(const gmlake::statistics& s, call c) { return s.calls[static_cast<std::size_t>(c)]; }

TEST_CASE("capture mode: no event, no release, no unmap; growth still works") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  a.backend().set_auto_complete(false);
  void* big = a.allocate(40 * C, s1);
  void* small = a.allocate(1000, s1);
  a.deallocate(big, 40 * C, s1);  // pending on stream 1
  a.set_capture_mode(true);
  CHECK(a.capture_mode());
  const auto before = a.stats();
  // Another stream may not take stream 1's pending bytes (that would need an event):
  void* other = a.allocate(40 * C, s2);
  REQUIRE(other != nullptr);
  CHECK(other != big);
  // Same stream: stream order makes it usable at once.
  void* same = a.allocate(40 * C, s1);
  CHECK(same == big);
  a.deallocate(same, 40 * C, s1);
  CHECK(a.release_cached() == 0);  // nothing released while capturing
  const auto during = a.stats();
  CHECK(calls(during, call::record) == calls(before, call::record));
  CHECK(calls(during, call::unmap) == calls(before, call::unmap));
  CHECK(calls(during, call::release) == calls(before, call::release));
  CHECK(a.check_invariants());
  a.set_capture_mode(false);
  a.deallocate(other, 40 * C, s2);
  a.deallocate(small, 1000, s1);
  gmlake_test::check_released(a);
}

TEST_CASE("capture mode: a growth that runs out keeps its new chunks until capture ends") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(8 * C, C), opts(), one_slot());
  void* live = a.allocate(5 * C);
  a.set_capture_mode(true);
  const auto before = a.stats();
  CHECK(a.try_allocate(4 * C) == nullptr);  // 3 chunks left: created, then the 4th fails
  const auto during = a.stats();
  CHECK(calls(during, call::create) > calls(before, call::create));
  CHECK(calls(during, call::release) == calls(before, call::release));
  CHECK(calls(during, call::unmap) == calls(before, call::unmap));
  CHECK(calls(during, call::address_free) == calls(before, call::address_free));
  CHECK(during.quarantined_bytes.current > 0);  // undone once capture ends
  CHECK(during.failed_cleanups == before.failed_cleanups);  // deferred, not failed
  CHECK(a.check_invariants());
  a.set_capture_mode(false);
  void* rest = a.allocate(3 * C);  // the next growth undoes them first
  CHECK(a.stats().quarantined_bytes.current == 0);
  CHECK(a.check_invariants());
  a.deallocate(rest);
  a.deallocate(live);
  gmlake_test::check_released(a);
}

TEST_CASE("capture mode: stitched blocks are cached, not evicted or unmapped") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(a.allocate(4 * C));
  for (int i = 0; i < 8; i += 2) a.deallocate(ps[i], 4 * C);  // four pieces, apart
  a.set_capture_mode(true);
  void* s = a.allocate(16 * C);  // stitched from the four
  REQUIRE(s != nullptr);
  const auto st = a.stats();
  CHECK(st.stitched_blocks.current >= 1);
  a.deallocate(s, 16 * C);
  CHECK(a.stats().stitched_blocks.current == st.stitched_blocks.current);  // cached
  CHECK(a.release_cached() == 0);
  a.set_capture_mode(false);
  for (int i = 1; i < 8; i += 2) a.deallocate(ps[i], 4 * C);
  gmlake_test::check_released(a);
}

TEST_CASE("visit_layout: segments are tiled by their pieces, allocations are seen") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(cap, C), opts(), one_slot());
  std::vector<void*> ps;
  for (int i = 0; i < 6; ++i) ps.push_back(a.allocate(3 * C));
  void* tiny = a.allocate(700);
  for (int i = 0; i < 6; i += 2) a.deallocate(ps[i], 3 * C);
  void* s = a.allocate(9 * C);  // a stitched block
  REQUIRE(s != nullptr);
  std::size_t segments = 0, stitched = 0, seg_bytes = 0, piece_bytes = 0, allocated = 0, by_stitch = 0;
  bool saw_tiny = false, saw_s = false;
  a.visit_layout(
      [&](const gmlake::layout_segment& g) {
        ++segments;
        stitched += g.kind == gmlake::layout_segment::stitched;
        seg_bytes += g.bytes;
      },
      [&](const gmlake::layout_piece& p) {
        piece_bytes += p.bytes;
        if (p.state == gmlake::layout_piece::allocated) {
          // an allocation over several handles is one piece in each: count starts
          allocated += p.address == reinterpret_cast<std::uintptr_t>(tiny) ||
                       p.address == reinterpret_cast<std::uintptr_t>(s) ||
                       p.address == reinterpret_cast<std::uintptr_t>(ps[1]) ||
                       p.address == reinterpret_cast<std::uintptr_t>(ps[3]) ||
                       p.address == reinterpret_cast<std::uintptr_t>(ps[5]);
          saw_tiny |= reinterpret_cast<void*>(p.address) == tiny;
          saw_s |= reinterpret_cast<void*>(p.address) == s;
        }
        if (p.state == gmlake::layout_piece::mapped_by_stitch) by_stitch += p.bytes;
      });
  CHECK(segments >= 2);
  CHECK(stitched == 1);
  CHECK(seg_bytes == piece_bytes);
  CHECK(allocated == 3 + 1 + 1);  // three pieces left, the tiny one, the stitched one
  CHECK(saw_tiny);
  CHECK(saw_s);
  CHECK(by_stitch >= 9 * C);
  a.deallocate(s, 9 * C);
  a.deallocate(tiny, 700);
  for (int i = 1; i < 6; i += 2) a.deallocate(ps[i], 3 * C);
  gmlake_test::check_released(a);
}

}  // namespace
