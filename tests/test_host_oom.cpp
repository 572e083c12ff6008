// tests/test_host_oom.cpp - a new stream when host memory has run out: the stream
// table cannot grow. Its own executable (gmlake-host-oom-tests), since it replaces
// the global operator new to make allocations fail on demand.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>
#include <doctest/doctest.h>

#include "support.hpp"

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {
bool fail_new = false;  // while set, operator new throws
}  // namespace

// The replacements pair malloc with free; GCC sees the free in operator delete and
// warns of a mismatch it cannot tell from a real one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  if (fail_new) throw std::bad_alloc();
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using gmlake::backend::host_memfd;
constexpr std::size_t C = 64 * 1024;
constexpr gmlake::host_stream s0{0}, x{7};

gmlake::options opts() {
  gmlake::options o;
  o.small_max = 16 * 1024;
  return o;
}

TEST_CASE("host out of memory: a free on a new stream waits for that stream's work") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(64 * C, C), opts());
  a.backend().set_auto_complete(false);
  void* p = a.allocate(4 * C, s0);
  (void)a.backend().record(x);  // work queued on x, which uses p
  REQUIRE(a.backend().pending(x));
  fail_new = true;  // x cannot be added to the stream table
  a.deallocate(p, 4 * C, x);
  fail_new = false;
  CHECK_FALSE(a.backend().pending(x));  // waited for before the bytes became free
  CHECK(a.stats().stream_waits == 1);
  CHECK(a.stats().allocations.current == 0);
  void* q = a.allocate(4 * C, s0);
  CHECK(q == p);  // reused, x's work done
  a.deallocate(q, 4 * C, s0);
  REQUIRE(a.check_invariants());
  gmlake_test::check_released(a);
}

TEST_CASE("host out of memory: in capture mode such a free keeps the block") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(64 * C, C), opts());
  a.backend().set_auto_complete(false);
  void* p = a.allocate(4 * C, s0);
  (void)a.backend().record(x);
  a.set_capture_mode(true);  // no event may be recorded or waited for
  fail_new = true;
  a.deallocate(p, 4 * C, x);
  fail_new = false;
  CHECK(a.backend().pending(x));
  CHECK(a.stats().allocations.current == 1);  // still allocated: never reused under x's work
  void* q = a.allocate(4 * C, s0);
  CHECK(q != p);
  a.deallocate(q, 4 * C, s0);
  a.set_capture_mode(false);
  a.backend().complete(x);
  a.deallocate(p, 4 * C, s0);  // the caller may free it again once it can
  REQUIRE(a.check_invariants());
  gmlake_test::check_released(a);
}

TEST_CASE("host out of memory: a request on a new stream fails as out of memory") {
  gmlake::gmlake_allocator<host_memfd> a(host_memfd(64 * C, C), opts());
  const auto before = a.stats();
  fail_new = true;
  void* p = a.try_allocate(C, gmlake::host_stream{9});
  fail_new = false;
  CHECK(p == nullptr);
  const auto after = a.stats();
  CHECK(after.num_ooms == before.num_ooms + 1);
  CHECK(after.fit[static_cast<std::size_t>(gmlake::fit_state::s5_oom)] ==
        before.fit[static_cast<std::size_t>(gmlake::fit_state::s5_oom)] + 1);
  gmlake_test::check_released(a);
}

}  // namespace
