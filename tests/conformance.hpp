// tests/conformance.hpp - the allocator contract, as one function run over every
// backend x configuration: test_conformance.cpp runs it on the host backends,
// cuda/test_cuda.cpp on the CUDA backend.
//
// A combo T gives: alloc_type; `real` (memory can be written and read back);
// make(); granularity() and capacity() of the backend it makes; write(dst, src, n)
// and read(dst, src, n) to move bytes between host buffers and allocated memory.
#pragma once

#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>
#include <doctest/doctest.h>

#include "support.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

namespace gmlake_conformance {

namespace policy = gmlake::policy;

constexpr std::size_t kib = 1024;
constexpr std::size_t mib = kib * kib;

inline std::atomic<int> misuse_count{0};
inline void record_misuse(const char*, void*) { ++misuse_count; }

inline gmlake::options test_options() {
  gmlake::options o;
  o.small_max = 16 * kib;
  o.on_misuse = &record_misuse;
  return o;
}

template <class B>
using custom_a = gmlake::basic_allocator<B, policy::largest_first, policy::no_cache, policy::low_address_fit>;
template <class B>
using custom_b = gmlake::basic_allocator<B, policy::best_fit_pieces, policy::evict_largest>;

// A pseudo-random byte buffer; block `id` holds pattern_buf[off(id) .. off(id)+size).
constexpr std::size_t pattern_period = 4096;
inline const std::vector<unsigned char>& pattern_buf(std::size_t gran) {
  static std::vector<unsigned char> buf;
  const std::size_t want = 6 * gran + pattern_period + 64;  // the largest filled block is 5 chunks
  if (buf.size() < want) {
    buf.resize(want);
    std::uint32_t x = 0x12345678u;
    for (auto& c : buf) {
      x = x * 1664525u + 1013904223u;
      c = static_cast<unsigned char>(x >> 24);
    }
  }
  return buf;
}
inline std::size_t pattern_offset(std::size_t id) { return (id * 97u) % pattern_period; }

template <class T>
void fill(void* p, std::size_t n, std::size_t id) {
  T::write(p, pattern_buf(T::granularity()).data() + pattern_offset(id), n);
}
template <class T>
bool holds(const void* p, std::size_t n, std::size_t id) {
  std::vector<unsigned char> got(n);
  T::read(got.data(), p, n);
  return std::memcmp(got.data(), pattern_buf(T::granularity()).data() + pattern_offset(id), n) == 0;
}
template <class T>
void set_bytes(void* p, unsigned char v, std::size_t n) {
  std::vector<unsigned char> b(n, v);
  T::write(p, b.data(), n);
}
template <class T>
unsigned char first_byte(const void* p) {
  unsigned char c = 0;
  T::read(&c, p, 1);
  return c;
}

struct block {
  void* p;
  std::size_t n;
  std::size_t id;
  bool stitched = false;
};

template <class A>
block alloc(A& a, std::size_t n, std::size_t id, std::size_t align = gmlake::block_alignment) {
  const auto before = a.stats().stitched_blocks.allocated;
  void* p = a.try_allocate(n, {}, align);
  return {p, n, id, a.stats().stitched_blocks.allocated != before};
}

template <class A>
void release(A& a, const block& b, bool pass_size = true) {
  a.deallocate(b.p, pass_size ? b.n : 0);
}

template <class A>
void free_all(A& a, std::vector<block>& live) {
  for (auto& b : live) release(a, b);
  live.clear();
}

using gmlake_test::check_released;

inline bool overlap(const block& x, const block& y) {
  const auto a = reinterpret_cast<std::uintptr_t>(x.p), b = reinterpret_cast<std::uintptr_t>(y.p);
  const std::size_t xn = x.n ? x.n : 1, yn = y.n ? y.n : 1;
  return a < b + yn && b < a + xn;
}

inline bool any_overlap(std::vector<block> v) {
  std::sort(v.begin(), v.end(), [](const block& x, const block& y) { return x.p < y.p; });
  for (std::size_t i = 1; i < v.size(); ++i)
    if (overlap(v[i - 1], v[i])) return true;
  return false;
}


/// The contract; call from a TEST_CASE (its SUBCASEs re-enter it).
template <class T>
void run_conformance() {
  misuse_count = 0;
  auto a = T::make();
  REQUIRE(a != nullptr);
  const std::size_t C = a->chunk_size();
  const std::size_t cap = T::capacity();
  REQUIRE(C == T::granularity());
  REQUIRE(a->check_invariants());
  std::vector<block> live;

  SUBCASE("zero bytes") {
    void* p = a->try_allocate(0);
    void* q = a->try_allocate(0);
    REQUIRE(p != nullptr);
    REQUIRE(q != nullptr);
    CHECK(p != q);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % gmlake::block_alignment == 0);
    CHECK(a->stats().allocations.current == 2);
    CHECK(a->stats().active_bytes.current == 2 * 512);
    CHECK(a->stats().requested_bytes.current == 0);
    if constexpr (T::real) {
      set_bytes<T>(p, 0xAB, 1);
      set_bytes<T>(q, 0xCD, 1);
      CHECK(first_byte<T>(p) == 0xAB);
    }
    live.push_back({p, 0, 0});
    live.push_back({q, 0, 1});
    CHECK(!any_overlap(live));
  }

  SUBCASE("sizes from 1 byte to several chunks") {
    const std::size_t sizes[] = {1, 2, 511, 512, 513, 1000, 4 * kib, 16 * kib - 1, 16 * kib, 16 * kib + 1,
                                 C - 1, C, C + 1, 2 * C, 2 * C + 512, 3 * C - 1, 5 * C};
    std::size_t id = 0;
    for (std::size_t n : sizes) {
      CAPTURE(n);
      void* p = a->try_allocate(n);
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % gmlake::block_alignment == 0);
      if constexpr (T::real) fill<T>(p, n, id);
      live.push_back({p, n, id++});
    }
    CHECK(!any_overlap(live));
    const auto s = a->stats();
    CHECK(s.allocations.current == static_cast<std::int64_t>(std::size(sizes)));
    std::int64_t req = 0, act = 0;
    for (std::size_t n : sizes) {
      req += static_cast<std::int64_t>(n);
      act += static_cast<std::int64_t>(gmlake::round_up(n, 512));
    }
    CHECK(s.requested_bytes.current == req);
    CHECK(s.active_bytes.current == act);
    CHECK(s.reserved_bytes.current >= act);
    if constexpr (T::real)
      for (const auto& b : live) CHECK(holds<T>(b.p, b.n, b.id));
    CHECK(a->check_invariants());
  }

  SUBCASE("alignment") {
    std::size_t id = 0;
    for (std::size_t al = 1; al <= C; al <<= 1) {
      for (std::size_t n : {std::size_t{100}, std::size_t{8 * kib}, C + 512}) {
        CAPTURE(al);
        CAPTURE(n);
        void* p = a->try_allocate(n, {}, al);
        REQUIRE(p != nullptr);
        CHECK(reinterpret_cast<std::uintptr_t>(p) % al == 0);
        CHECK(reinterpret_cast<std::uintptr_t>(p) % gmlake::block_alignment == 0);
        if constexpr (T::real) fill<T>(p, n, id);
        live.push_back({p, n, id++});
      }
    }
    CHECK(!any_overlap(live));
    if constexpr (T::real)
      for (const auto& b : live) CHECK(holds<T>(b.p, b.n, b.id));
    const auto before = a->stats();
    CHECK(a->try_allocate(100, {}, 2 * C) == nullptr);
    CHECK(a->try_allocate(2 * C, {}, 4 * C) == nullptr);
    CHECK(a->try_allocate(100, {}, 768) == nullptr);   // not a power of two
    CHECK_THROWS_AS((void)a->allocate(100, {}, 2 * C), gmlake::out_of_memory);
    const auto after = a->stats();
    CHECK(after.allocations.current == before.allocations.current);
    CHECK(after.reserved_bytes.current == before.reserved_bytes.current);
    CHECK(a->check_invariants());
  }

  SUBCASE("live blocks do not overlap") {
    std::mt19937 rng(7);
    std::size_t id = 0;
    for (int i = 0; i < 60; ++i) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 2 * C)(rng);
      const block b = alloc(*a, n, id++);
      REQUIRE(b.p != nullptr);
      live.push_back(b);
      if (i % 3 == 2) {  // free one in the middle now and then
        const std::size_t k = rng() % live.size();
        release(*a, live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    CHECK(!any_overlap(live));
    if constexpr (T::real) {
      for (const auto& b : live) fill<T>(b.p, b.n, b.id);
      for (const auto& b : live) CHECK(holds<T>(b.p, b.n, b.id));
    }
  }

  SUBCASE("over capacity") {
    void* keep = a->try_allocate(3 * C);
    REQUIRE(keep != nullptr);
    live.push_back({keep, 3 * C, 0});
    const auto before = a->stats();
    const std::size_t big = a->backend().capacity() + 1;
    CHECK(a->try_allocate(big) == nullptr);
    bool thrown = false;
    try {
      (void)a->allocate(big);
    } catch (const gmlake::out_of_memory& e) {
      thrown = true;
      CHECK(e.bytes() == big);
    }
    CHECK(thrown);
    CHECK(a->try_allocate(SIZE_MAX) == nullptr);
    // Fits the capacity but not what is left.
    CHECK(a->try_allocate(a->backend().capacity()) == nullptr);
    CHECK_THROWS_AS((void)a->allocate(a->backend().capacity()), std::bad_alloc);
    const auto after = a->stats();
    CHECK(after.allocations.current == before.allocations.current);
    CHECK(after.active_bytes.current == before.active_bytes.current);
    CHECK(after.num_ooms >= before.num_ooms + 4);
    CHECK(after.fit[static_cast<std::size_t>(gmlake::fit_state::s5_oom)] >= before.fit[4] + 4);
    CHECK(a->check_invariants());
    // Still usable.
    void* p = a->try_allocate(C);
    REQUIRE(p != nullptr);
    live.push_back({p, C, 1});
    if constexpr (T::real) {
      fill<T>(keep, 3 * C, 0);
      fill<T>(p, C, 1);
      CHECK(holds<T>(keep, 3 * C, 0));
      CHECK(holds<T>(p, C, 1));
    }
  }

  SUBCASE("seeded random mix with patterns") {
    std::mt19937 rng(12345);
    std::size_t id = 0;
    auto pick_size = [&]() -> std::size_t {
      const unsigned r = rng() % 10;
      if (r < 4) return std::uniform_int_distribution<std::size_t>(1, 4 * kib)(rng);          // small
      if (r < 6) return std::uniform_int_distribution<std::size_t>(4 * kib, C)(rng);         // medium
      return std::uniform_int_distribution<std::size_t>(C, 3 * C)(rng);                      // multi-chunk
    };
    auto verify_all = [&] {
      bool ok = true;
      if constexpr (T::real)
        for (const auto& b : live) ok = holds<T>(b.p, b.n, b.id) && ok;
      return ok;
    };
    auto free_one = [&] {
      REQUIRE(verify_all());
      const std::size_t k = rng() % live.size();
      release(*a, live[k], (rng() & 1) != 0);
      live[k] = live.back();
      live.pop_back();
    };
    for (int op = 0; op < 300; ++op) {
      if (!live.empty() && (rng() % 100 < 45 || live.size() > 60)) {
        free_one();
        continue;
      }
      const std::size_t n = pick_size();
      const block b = alloc(*a, n, id++);
      if (b.p == nullptr) {  // may only fail once much is live
        CHECK(a->stats().active_bytes.current > static_cast<std::int64_t>(cap / 4));
        if (!live.empty()) free_one();
        continue;
      }
      CHECK(reinterpret_cast<std::uintptr_t>(b.p) % 512 == 0);
      if constexpr (T::real) fill<T>(b.p, n, b.id);
      live.push_back(b);
      if (op % 50 == 49) {
        CHECK(!any_overlap(live));
        (void)a->release_cached();
        CHECK(verify_all());
      }
    }
    CHECK(!any_overlap(live));
    CHECK(verify_all());
    while (!live.empty()) free_one();
  }

  auto exhaust = [&](std::vector<block>& v) {
    for (std::size_t i = 0;; ++i) {
      void* p = a->try_allocate(C);
      if (p == nullptr) break;
      v.push_back({p, C, i});
      if constexpr (T::real) set_bytes<T>(p, static_cast<unsigned char>(i & 0xff), 64);
      REQUIRE(v.size() <= cap / C);
    }
  };
  auto exhaustion = [&](int order) {
    exhaust(live);
    const std::size_t n = live.size();
    CHECK(n == cap / C);
    CHECK(a->stats().reserved_bytes.current == static_cast<std::int64_t>(cap));
    CHECK(!any_overlap(live));
    CHECK(a->try_allocate(1) == nullptr);
    CHECK(a->check_invariants());
    if (order == 1) std::reverse(live.begin(), live.end());
    if (order == 2) std::shuffle(live.begin(), live.end(), std::mt19937(99));
    for (const auto& b : live) {
      if constexpr (T::real) CHECK(first_byte<T>(b.p) == static_cast<unsigned char>(b.id & 0xff));
      release(*a, b);
    }
    live.clear();
    CHECK(a->stats().allocations.current == 0);
    CHECK(a->check_invariants());
    // Everything again, in chunks.
    exhaust(live);
    CHECK(live.size() == n);
    free_all(*a, live);
    // And in one block, after the cache is released, and without it.
    void* whole = a->try_allocate(cap);
    CHECK(whole != nullptr);
    if (whole != nullptr) {
      if constexpr (T::real) {
        set_bytes<T>(whole, 0x5A, 1);
        set_bytes<T>(static_cast<char*>(whole) + cap - 1, 0xA5, 1);
      }
      live.push_back({whole, cap, 0});
      free_all(*a, live);
    }
    (void)a->release_cached();
    whole = a->try_allocate(cap);
    CHECK(whole != nullptr);
    if (whole != nullptr) live.push_back({whole, cap, 0});
  };
  SUBCASE("exhaustion, free forward") { exhaustion(0); }
  SUBCASE("exhaustion, free reverse") { exhaustion(1); }
  SUBCASE("exhaustion, free random") { exhaustion(2); }

  free_all(*a, live);
  check_released(*a);
  CHECK(misuse_count == 0);
}

} // namespace gmlake_conformance
