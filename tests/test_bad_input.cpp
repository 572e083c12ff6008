// tests/test_bad_input.cpp - bad input, each with its documented result.
//
// Built twice: in gmlake-tests (GMLAKE_DEBUG=2) and in gmlake-release-tests
// (GMLAKE_DEBUG=0, NDEBUG). Misuse goes to options::on_misuse when set; without a
// hook it aborts with a message from GMLAKE_DEBUG 1 on (checked in a child process)
// and is ignored at 0. Either way the allocator's state is as before the bad call:
// check_invariants() holds, the other blocks keep their data, and everything is
// released at the end.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>
#include <doctest/doctest.h>

#include "support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory_resource>
#include <string>
#include <vector>

namespace {

using gmlake::backend::counting;
using gmlake::backend::host_memfd;
using gmlake::backend::simulated;

constexpr std::size_t kib = 1024;
constexpr std::size_t C = 64 * kib;
constexpr std::size_t cap = 64 * C;

int misuses = 0;
std::string last_misuse;
void on_misuse(const char* what, void*) {
  ++misuses;
  last_misuse = what;
}

gmlake::options hooked() {
  gmlake::options o;
  o.small_max = 16 * kib;
  o.on_misuse = &on_misuse;
  return o;
}
gmlake::options unhooked() {
  gmlake::options o;
  o.small_max = 16 * kib;
  return o;
}

using memfd_alloc = gmlake::gmlake_allocator<host_memfd>;

void fill(void* p, std::size_t n, unsigned char v) { std::memset(p, v, n); }
bool holds(const void* p, std::size_t n, unsigned char v) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (c[i] != v) return false;
  return true;
}

/// How a child process ended.
struct ending {
  bool signaled = false;
  int signal = 0;
  int status = 0;
  std::string err;  ///< what it wrote to stderr
};

/// Runs f in a child process (stderr captured), so that an abort can be checked.
template <class F>
ending in_child(F f) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child's own crash is the result: no doctest report of it on stdout.
    std::signal(SIGABRT, SIG_DFL);
    std::signal(SIGSEGV, SIG_DFL);
    std::signal(SIGBUS, SIG_DFL);
    if (FILE* null = std::freopen("/dev/null", "w", stdout)) (void)null;
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    f();
    std::fflush(stderr);
    ::_exit(0);
  }
  ::close(fds[1]);
  ending e;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) e.err.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  e.signaled = WIFSIGNALED(st);
  e.signal = e.signaled ? WTERMSIG(st) : 0;
  e.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return e;
}

/// Misuse without a hook: debug builds abort with `message`; release builds go on.
template <class F>
void misuse_without_hook(F f, const char* message) {
  const ending e = in_child(f);
  CAPTURE(e.err);
#if GMLAKE_DEBUG >= 1
  CHECK(e.signaled);
  CHECK(e.signal == SIGABRT);
  CHECK(e.err.find(message) != std::string::npos);
  CHECK(e.err.find("gmlake: misuse") != std::string::npos);
#else
  (void)message;
  CHECK(!e.signaled);
  CHECK(e.status == 0);  // the child checked its state and exits 0 only if it was sound
#endif
}

} // namespace

TEST_CASE("bad input: size 0 is served as a distinct 1-byte block") {
  misuses = 0;
  memfd_alloc a(host_memfd(cap, C), hooked());
  void* p = a.allocate(0);
  void* q = a.allocate(0);
  REQUIRE(p != nullptr);
  REQUIRE(q != nullptr);
  CHECK(p != q);
  *static_cast<unsigned char*>(p) = 1;
  CHECK(a.stats().requested_bytes.current == 0);
  CHECK(a.stats().active_bytes.current == 1024);  // two 512-byte blocks
  a.deallocate(p, 0);
  a.deallocate(q);
  CHECK(misuses == 0);
  gmlake_test::check_released(a);
}

TEST_CASE("bad input: SIZE_MAX and sizes above capacity fail at once, state unchanged") {
  misuses = 0;
  gmlake::gmlake_allocator<counting<simulated>> a(counting<simulated>(cap, C), hooked());
  void* keep = a.allocate(3 * C);
  const auto s0 = a.stats();
  const auto creates = a.backend().counts().calls_of(gmlake::call::create);
  for (std::size_t n : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 511, SIZE_MAX / 2 + 1, cap + 1, 2 * cap}) {
    CAPTURE(n);
    CHECK(a.try_allocate(n) == nullptr);
    CHECK(a.try_allocate(n, gmlake::host_stream{5}) == nullptr);
    try {
      (void)a.allocate(n);
      CHECK(false);
    } catch (const gmlake::out_of_memory& e) {
      CHECK(e.bytes() == n);
    }
  }
  const auto s1 = a.stats();
  CHECK(a.backend().counts().calls_of(gmlake::call::create) == creates);  // not even tried
  CHECK(s1.reserved_bytes.current == s0.reserved_bytes.current);
  CHECK(s1.allocations.current == 1);
  CHECK(s1.num_ooms == s0.num_ooms + 18);
  // Exactly the capacity is not "above": it fails only because 3 chunks are in use.
  CHECK(a.try_allocate(cap) == nullptr);
  a.deallocate(keep);
  void* all = a.allocate(cap);
  CHECK(all != nullptr);
  a.deallocate(all);
  memfd_alloc m(host_memfd(cap, C), hooked());
  gmlake::memory_resource mr(m);
  CHECK_THROWS_AS((void)mr.allocate(SIZE_MAX, 8), gmlake::out_of_memory);
  CHECK(misuses == 0);
  gmlake_test::check_released(a);
  gmlake_test::check_released(m);
}

TEST_CASE("bad input: alignment not a power of two, or above the chunk size") {
  misuses = 0;
  memfd_alloc a(host_memfd(cap, C), hooked());
  for (std::size_t al : {std::size_t{0}, std::size_t{3}, std::size_t{100}, std::size_t{768}, C + 512, 2 * C,
                         std::size_t{1} << 63, SIZE_MAX}) {
    CAPTURE(al);
    CHECK(a.try_allocate(100, {}, al) == nullptr);
    CHECK(a.try_allocate(3 * C, {}, al) == nullptr);
    CHECK_THROWS_AS((void)a.allocate(100, {}, al), gmlake::out_of_memory);
  }
  CHECK(a.stats().allocations.current == 0);
  CHECK(a.stats().reserved_bytes.current == 0);
  // The largest valid alignment is the chunk size (here max_alignment()).
  CHECK(a.max_alignment() == C);
  void* p = a.allocate(100, {}, C);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % C == 0);
  void* q = a.allocate(3 * C, {}, C);
  CHECK(reinterpret_cast<std::uintptr_t>(q) % C == 0);
  a.deallocate(p);
  a.deallocate(q);
  memfd_alloc m(host_memfd(cap, C), hooked());
  gmlake::memory_resource mr(m);
  for (std::size_t al : {std::size_t{3}, 2 * C, SIZE_MAX}) CHECK_THROWS_AS((void)mr.allocate(64, al), gmlake::bad_alignment);
  CHECK(misuses == 0);
  gmlake_test::check_released(a);
  gmlake_test::check_released(mr.allocator());
}

TEST_CASE("bad input: alignment above max_alignment() with a chunk that is not a power of two") {
  misuses = 0;
  gmlake::options o = hooked();
  o.chunk_size = 3 * C;  // slot boundaries 3C apart: only every other one is 2C-aligned
  memfd_alloc a(host_memfd(cap, C), o);
  CHECK(a.chunk_size() == 3 * C);
  CHECK(a.max_alignment() == C);
  CHECK(a.try_allocate(3 * C, {}, 2 * C) == nullptr);
  CHECK(a.try_allocate(100, {}, 4 * C) == nullptr);
  gmlake::memory_resource mr(a);
  CHECK_THROWS_AS((void)mr.allocate(3 * C, 2 * C), gmlake::bad_alignment);
  // Up to max_alignment(), every block is aligned, lies in its own bytes and keeps its data,
  // each one placed in new chunks (growth).
  std::vector<void*> live;
  for (int i = 0; i < 6; ++i) {
    void* p = mr.allocate(3 * C, C);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % C == 0);
    fill(p, 3 * C, static_cast<unsigned char>(i + 1));
    REQUIRE(a.check_invariants());
    live.push_back(p);
  }
  for (int i = 0; i < 6; ++i) CHECK(holds(live[static_cast<std::size_t>(i)], 3 * C, static_cast<unsigned char>(i + 1)));
  for (void* p : live) mr.deallocate(p, 3 * C, C);
  CHECK(misuses == 0);
  gmlake_test::check_released(a);
}

TEST_CASE("bad input: alignment above max_alignment() where address space is aligned to less than the chunk") {
  misuses = 0;
  simulated b(cap, C);
  const auto shift = b.reserve(C);  // the arenas' reservations now start at an odd multiple of C
  REQUIRE(shift);
  gmlake::options o = hooked();
  o.chunk_size = 2 * C;
  gmlake::gmlake_allocator<simulated> a(std::move(b), o);
  CHECK(a.chunk_size() == 2 * C);
  CHECK(a.max_alignment() == C);
  CHECK(a.try_allocate(2 * C, {}, 2 * C) == nullptr);
  std::vector<void*> live;
  for (int i = 0; i < 4; ++i) {
    void* p = a.try_allocate(2 * C, {}, C);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % C == 0);
    REQUIRE(a.check_invariants());
    live.push_back(p);
  }
  for (void* p : live) a.deallocate(p);
  CHECK(misuses == 0);
  gmlake_test::check_released(a);
}

TEST_CASE("bad input: double free and foreign pointers, small, large and stitched") {
  misuses = 0;
  memfd_alloc a(host_memfd(cap, C), hooked());
  void* small = a.allocate(2 * kib);
  void* large = a.allocate(2 * C);
  std::vector<void*> four;
  for (int i = 0; i < 4; ++i) four.push_back(a.allocate(2 * C));
  a.deallocate(four[0]);
  a.deallocate(four[2]);
  void* stitched = a.allocate(4 * C);
  REQUIRE(a.stats().stitched_blocks.current == 1);
  fill(small, 2 * kib, 1);
  fill(large, 2 * C, 2);
  fill(stitched, 4 * C, 3);
  int local = 0;
  std::vector<char> heap(100);
  const auto s0 = a.stats();
  int expected = 0;
  auto bad = [&](void* p, std::size_t n = 0) {
    a.deallocate(p, n);
    ++expected;
    CHECK(misuses == expected);
    CHECK(a.check_invariants());
  };
  bad(four[0]);                                 // freed before (now under the stitch)
  bad(&local);                                  // stack
  bad(heap.data());                             // heap
  bad(static_cast<char*>(small) + 512);         // inside a live small block
  bad(static_cast<char*>(large) + 512);         // inside a live large block
  bad(static_cast<char*>(stitched) + 512);      // inside a live stitched block
  bad(reinterpret_cast<void*>(std::uintptr_t{0x1000}));
  bad(reinterpret_cast<void*>(UINTPTR_MAX - 4095));
  const auto s1 = a.stats();
  CHECK(s1.invalid_frees == s0.invalid_frees + static_cast<std::uint64_t>(expected));
  CHECK(s1.allocations.current == s0.allocations.current);
  CHECK(s1.active_bytes.current == s0.active_bytes.current);
  CHECK(holds(small, 2 * kib, 1));
  CHECK(holds(large, 2 * C, 2));
  CHECK(holds(stitched, 4 * C, 3));
  a.deallocate(small);
  bad(small);  // double free, small arena
  a.deallocate(stitched);
  bad(stitched);  // double free of a cached stitched block
  (void)a.release_cached();
  bad(stitched);  // ... and of one released since
  a.deallocate(large);
  (void)a.release_cached();
  bad(large);  // its chunks are gone: a hole now
  a.deallocate(four[1]);
  a.deallocate(four[3]);
  CHECK(a.stats().invalid_frees == s0.invalid_frees + static_cast<std::uint64_t>(expected));
  (void)a.release_cached();
  CHECK(a.check_invariants());
  const auto s = a.stats();
  CHECK(s.allocations.current == 0);
  CHECK(s.reserved_bytes.current == 0);
  CHECK(s.mapped_bytes.current == 0);
  CHECK(s.stitched_blocks.current == 0);
}

TEST_CASE("bad input: free with a wrong size is reported, the recorded size is used") {
  misuses = 0;
  memfd_alloc a(host_memfd(cap, C), hooked());
  void* p = a.allocate(3 * kib);
  void* q = a.allocate(3 * C);
  a.deallocate(p, 5 * kib);
  CHECK(misuses == 1);
  CHECK(last_misuse == "free with a size other than the one allocated");
  a.deallocate(q, 1);
  CHECK(misuses == 2);
  CHECK(a.stats().allocations.current == 0);
  CHECK(a.stats().active_bytes.current == 0);
  CHECK(a.stats().invalid_frees == 0);
  gmlake_test::check_released(a);
}

TEST_CASE("bad input: free on a stream other than the allocating one is defined") {
  // Not misuse: the stream given to deallocate is the one whose work must finish
  // before another stream may reuse the bytes (as cudaFreeAsync).
  misuses = 0;
  memfd_alloc a(host_memfd(cap, C), hooked());
  a.backend().set_auto_complete(false);
  void* p = a.allocate(C, gmlake::host_stream{1});
  void* fence = a.allocate(C, gmlake::host_stream{1});
  a.deallocate(p, C, gmlake::host_stream{2});  // allocated on 1, freed on 2
  void* on1 = a.allocate(C, gmlake::host_stream{1});
  CHECK(on1 != p);  // stream 2's work is pending: stream 1 must wait
  void* on2 = a.allocate(C, gmlake::host_stream{2});
  CHECK(on2 == p);  // reused on the stream it was freed on
  a.deallocate(on1, C, gmlake::host_stream{1});
  a.deallocate(on2, C, gmlake::host_stream{99});  // a stream never seen before
  a.deallocate(fence, C, gmlake::host_stream{1});
  CHECK(misuses == 0);
  CHECK(a.check_invariants());
  gmlake_test::check_released(a);
}

TEST_CASE("bad input: use after release_cached faults at once (memory is unmapped)") {
  const ending e = in_child([] {
    memfd_alloc a(host_memfd(cap, C), hooked());
    void* keep = a.allocate(C);
    auto* p = static_cast<volatile unsigned char*>(a.allocate(4 * C));
    p[0] = 1;
    a.deallocate(const_cast<unsigned char*>(p));
    (void)a.release_cached();
    p[0] = 2;  // PROT_NONE now: SIGSEGV
    std::fprintf(stderr, "no fault (keep %p)\n", keep);
  });
  CAPTURE(e.err);
  // Plain: killed by SIGSEGV. Under ASan: its SEGV report, exit code 1.
  CHECK((e.signaled ? e.signal == SIGSEGV : e.err.find("SEGV") != std::string::npos));
  CHECK(e.err.find("no fault") == std::string::npos);
}

TEST_CASE("bad input: live blocks survive release_cached") {
  memfd_alloc a(host_memfd(cap, C), hooked());
  void* s = a.allocate(kib);
  void* l = a.allocate(5 * C);
  fill(s, kib, 7);
  fill(l, 5 * C, 8);
  (void)a.release_cached();
  CHECK(holds(s, kib, 7));
  CHECK(holds(l, 5 * C, 8));
  fill(l, 5 * C, 9);
  CHECK(holds(l, 5 * C, 9));
  a.deallocate(s);
  a.deallocate(l);
  gmlake_test::check_released(a);
}

TEST_CASE("bad input: destroying the allocator with live blocks releases everything") {
  using real = counting<host_memfd>;
  real backend(cap, C);
  misuses = 0;
  {
    gmlake::gmlake_allocator<gmlake_test::borrowed<real>> a(gmlake_test::borrowed<real>(&backend), hooked());
    void* p = a.allocate(kib);
    std::vector<void*> four;
    for (int i = 0; i < 4; ++i) four.push_back(a.allocate(2 * C));
    a.deallocate(four[0]);
    a.deallocate(four[2]);
    void* x = a.allocate(4 * C);  // a live stitched block
    (void)p;
    (void)x;
    CHECK(backend.parent().chunk_count() > 0);
  }
  CHECK(misuses == 1);
  CHECK(last_misuse == "allocator destroyed with live allocations");
  CHECK(backend.parent().chunk_count() == 0);
  CHECK(backend.parent().mapping_count() == 0);
  CHECK(backend.parent().reservation_count() == 0);
  const auto& c = backend.counts();
  CHECK(c.calls_of(gmlake::call::create) == c.calls_of(gmlake::call::release));
  CHECK(c.calls_of(gmlake::call::reserve) == c.calls_of(gmlake::call::address_free));
}

TEST_CASE("bad input: misuse without a hook (debug: abort with a message; release: ignored)") {
  misuse_without_hook(
      [] {
        memfd_alloc a(host_memfd(cap, C), unhooked());
        void* p = a.allocate(kib);
        a.deallocate(p);
        a.deallocate(p);
        if (!a.check_invariants() || a.stats().invalid_frees != 1) ::_exit(3);
        void* q = a.allocate(kib);
        a.deallocate(q);
      },
      "double free");
  misuse_without_hook(
      [] {
        memfd_alloc a(host_memfd(cap, C), unhooked());
        int local = 0;
        a.deallocate(&local);
        if (!a.check_invariants() || a.stats().invalid_frees != 1) ::_exit(3);
      },
      "free of a pointer not allocated here");
  misuse_without_hook(
      [] {
        memfd_alloc a(host_memfd(cap, C), unhooked());
        void* p = a.allocate(3 * C);
        a.deallocate(p, 7);
        if (!a.check_invariants() || a.stats().allocations.current != 0) ::_exit(3);
      },
      "free with a size other than the one allocated");
  misuse_without_hook(
      [] {
        memfd_alloc a(host_memfd(cap, C), unhooked());
        (void)a.allocate(3 * C);
      },
      "allocator destroyed with live allocations");
}
