// tests/test_backends.cpp - the host backends, the counting decorator, host streams.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gmlake/backend/counting.hpp"
#include "gmlake/backend/host_memfd.hpp"
#include "gmlake/backend/simulated.hpp"
#include "gmlake/detail/host_streams.hpp"

using gmlake::call;
using gmlake::errc;
using gmlake::PhysicalBackend;
using gmlake::backend::counting;
using gmlake::backend::host_memfd;
using gmlake::backend::simulated;

static_assert(PhysicalBackend<counting<simulated>>);
static_assert(PhysicalBackend<counting<host_memfd>>);
static_assert(!std::is_copy_constructible_v<host_memfd>);
static_assert(std::is_nothrow_move_constructible_v<host_memfd>);
static_assert(std::is_nothrow_move_assignable_v<host_memfd>);

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

std::uint32_t pattern(std::size_t i) noexcept { return static_cast<std::uint32_t>(i * 2654435761u + 17u); }

} // namespace

// ---------------------------------------------------------------- host_memfd

TEST_CASE("host_memfd: two chunks stitched, then aliased in reverse order") {
  const std::size_t g = 2 * mib;
  host_memfd b(8 * g, g);
  CHECK(b.granularity() == g);
  CHECK(b.capacity() == 8 * g);

  auto c0 = b.create(g);
  auto c1 = b.create(2 * g);
  REQUIRE(c0);
  REQUIRE(c1);
  CHECK(c0.value.size == g);
  CHECK(c1.value.size == 2 * g);
  CHECK(!(c0.value == c1.value));
  CHECK(b.created_bytes() == 3 * g);

  // Side by side in one reservation: [c0][c1].
  auto va = b.reserve(3 * g);
  REQUIRE(va);
  CHECK(va.value % g == 0);
  REQUIRE(b.map(va.value, g, c0.value) == errc::ok);
  REQUIRE(b.map(va.value + g, 2 * g, c1.value) == errc::ok);
  REQUIRE(b.set_access(va.value, 3 * g) == errc::ok);

  auto* words = reinterpret_cast<std::uint32_t*>(va.value);
  const std::size_t count = 3 * g / sizeof(std::uint32_t);
  for (std::size_t i = 0; i < count; ++i) words[i] = pattern(i);

  // Same chunks in a second reservation, reversed: [c1][c0].
  auto vb = b.reserve(3 * g);
  REQUIRE(vb);
  CHECK(vb.value != va.value);
  REQUIRE(b.map(vb.value, 2 * g, c1.value) == errc::ok);
  REQUIRE(b.map(vb.value + 2 * g, g, c0.value) == errc::ok);
  REQUIRE(b.set_access(vb.value, 3 * g) == errc::ok);
  CHECK(b.mapping_count() == 4);

  const auto* alias = reinterpret_cast<const std::uint32_t*>(vb.value);
  const std::size_t w0 = g / sizeof(std::uint32_t);      // words of c0
  const std::size_t w1 = 2 * g / sizeof(std::uint32_t);  // words of c1
  bool same = true;
  for (std::size_t i = 0; i < w1 && same; ++i) same = alias[i] == pattern(w0 + i);   // c1 first
  for (std::size_t i = 0; i < w0 && same; ++i) same = alias[w1 + i] == pattern(i);   // then c0
  CHECK(same);

  // A write through the alias shows through the first mapping.
  const_cast<std::uint32_t*>(alias)[w1] = 0xdeadbeef;
  CHECK(words[0] == 0xdeadbeef);

  // Release while still mapped: the memory stays until the last mapping goes.
  CHECK(b.release(c0.value) == errc::ok);
  CHECK(b.created_bytes() == 3 * g);
  CHECK(b.release(c0.value) == errc::invalid);     // released twice
  CHECK(b.map(va.value, g, c0.value) == errc::invalid);  // mapping a released handle
  CHECK(words[1] == pattern(1));                  // still readable

  CHECK(b.unmap(va.value, 3 * g) == errc::ok);
  CHECK(b.created_bytes() == 3 * g);  // c0 still mapped at vb
  CHECK(b.address_free(va.value, 3 * g) == errc::ok);
  CHECK(b.unmap(vb.value, 3 * g) == errc::ok);
  CHECK(b.created_bytes() == 2 * g);  // c0 gone at its last unmap
  CHECK(b.chunk_count() == 1);
  CHECK(b.release(c1.value) == errc::ok);
  CHECK(b.created_bytes() == 0);
  CHECK(b.address_free(vb.value, 3 * g) == errc::ok);
  CHECK(b.reservation_count() == 0);
  CHECK(b.mapping_count() == 0);
  CHECK(b.chunk_count() == 0);
}

TEST_CASE("host_memfd: out of memory past capacity, release gives it back") {
  const std::size_t g = 2 * mib;
  host_memfd b(4 * g, g);
  auto a = b.create(3 * g);
  REQUIRE(a);
  CHECK(b.create(2 * g).error == errc::out_of_memory);
  auto c = b.create(g);
  REQUIRE(c);
  CHECK(b.created_bytes() == 4 * g);
  CHECK(b.create(g).error == errc::out_of_memory);
  CHECK(b.create(8 * g).error == errc::out_of_memory);

  CHECK(b.release(a.value) == errc::ok);
  CHECK(b.created_bytes() == g);
  auto d = b.create(3 * g);  // first fit reuses the freed run
  REQUIRE(d);
  CHECK(d.value.offset == 0);
  CHECK(b.release(d.value) == errc::ok);
  CHECK(b.release(c.value) == errc::ok);
  CHECK(b.created_bytes() == 0);
  auto all = b.create(4 * g);
  REQUIRE(all);
  CHECK(b.release(all.value) == errc::ok);
}

TEST_CASE("host_memfd: contiguity is needed, first fit") {
  const std::size_t g = 2 * mib;
  host_memfd b(4 * g, g);
  auto a = b.create(g);
  auto c = b.create(g);
  auto d = b.create(2 * g);
  REQUIRE((a && c && d));
  CHECK(b.release(a.value) == errc::ok);
  CHECK(b.release(d.value) == errc::ok);
  // Free: slot 0, slots 2..3. Three granules free but not three in a row.
  CHECK(b.create(3 * g).error == errc::out_of_memory);
  auto e = b.create(2 * g);
  REQUIRE(e);
  CHECK(e.value.offset == 2 * g);
  CHECK(b.release(c.value) == errc::ok);
  CHECK(b.release(e.value) == errc::ok);
}

TEST_CASE("host_memfd: invalid arguments") {
  const std::size_t g = 2 * mib;
  host_memfd b(4 * g, g);

  CHECK(b.create(0).error == errc::invalid);
  CHECK(b.create(g + 4096).error == errc::invalid);
  CHECK(b.reserve(0).error == errc::invalid);
  CHECK(b.reserve(g / 2).error == errc::invalid);
  CHECK(b.release(host_memfd::chunk_type{}) == errc::invalid);  // never created
  CHECK(b.address_free(0x1000, g) == errc::invalid);

  auto c = b.create(2 * g);
  REQUIRE(c);
  CHECK(b.release(host_memfd::chunk_type{c.value.offset, g}) == errc::invalid);  // wrong size

  auto va = b.reserve(4 * g);
  REQUIRE(va);
  const std::uintptr_t v = va.value;
  CHECK(b.map(v, g, c.value) == errc::invalid);                  // n != chunk size
  CHECK(b.map(v + 4096, 2 * g, c.value) == errc::invalid);       // misaligned
  CHECK(b.map(v + 3 * g, 2 * g, c.value) == errc::invalid);      // runs past the reservation
  CHECK(b.map(0x200000, 2 * g, c.value) == errc::invalid);       // not reserved
  CHECK(b.set_access(v, 2 * g) == errc::invalid);                // nothing mapped
  CHECK(b.unmap(v, 2 * g) == errc::invalid);                     // nothing mapped

  REQUIRE(b.map(v + g, 2 * g, c.value) == errc::ok);
  CHECK(b.map(v, 2 * g, c.value) == errc::invalid);              // overlaps the mapping
  CHECK(b.map(v + 2 * g, 2 * g, c.value) == errc::invalid);      // overlaps the mapping
  CHECK(b.set_access(v, 3 * g) == errc::invalid);                // first granule unmapped
  CHECK(b.set_access(v + g, 3 * g) == errc::invalid);            // last granule unmapped
  CHECK(b.set_access(v + g, g) == errc::ok);                     // part of a mapping is fine
  CHECK(b.set_access(v + g, 2 * g) == errc::ok);
  CHECK(b.unmap(v + g, g) == errc::invalid);                     // half a mapping
  CHECK(b.unmap(v + 2 * g, g) == errc::invalid);                 // not at a mapping start
  CHECK(b.unmap(v, 3 * g) == errc::invalid);                     // starts at a gap
  CHECK(b.address_free(v, 4 * g) == errc::invalid);              // still mapped
  CHECK(b.address_free(v, 2 * g) == errc::invalid);              // not the whole reservation

  CHECK(b.unmap(v + g, 2 * g) == errc::ok);
  CHECK(b.unmap(v + g, 2 * g) == errc::invalid);                 // twice
  CHECK(b.address_free(v, 4 * g) == errc::ok);
  CHECK(b.address_free(v, 4 * g) == errc::invalid);              // twice
  CHECK(b.release(c.value) == errc::ok);
  CHECK(b.created_bytes() == 0);
}

TEST_CASE("host_memfd: unmap keeps the reservation, it can be mapped again") {
  const std::size_t g = 2 * mib;
  host_memfd b(4 * g, g);
  auto c = b.create(g);
  auto va = b.reserve(2 * g);
  REQUIRE((c && va));
  for (int round = 0; round < 3; ++round) {
    REQUIRE(b.map(va.value + g, g, c.value) == errc::ok);
    REQUIRE(b.set_access(va.value + g, g) == errc::ok);
    auto* p = reinterpret_cast<unsigned char*>(va.value + g);
    if (round > 0) CHECK(p[7] == static_cast<unsigned char>(round));  // same memory each time
    p[7] = static_cast<unsigned char>(round + 1);
    REQUIRE(b.unmap(va.value + g, g) == errc::ok);
  }
  CHECK(b.address_free(va.value, 2 * g) == errc::ok);
  CHECK(b.release(c.value) == errc::ok);
}

TEST_CASE("host_memfd: released memory is given back zeroed, construction checks") {
  const std::size_t g = 2 * mib;
  host_memfd b(g, g);
  auto va = b.reserve(g);
  REQUIRE(va);
  {
    auto c = b.create(g);
    REQUIRE(c);
    REQUIRE(b.map(va.value, g, c.value) == errc::ok);
    REQUIRE(b.set_access(va.value, g) == errc::ok);
    std::memset(reinterpret_cast<void*>(va.value), 0xab, g);
    REQUIRE(b.unmap(va.value, g) == errc::ok);
    REQUIRE(b.release(c.value) == errc::ok);  // punches the hole
  }
  auto c = b.create(g);
  REQUIRE(c);
  REQUIRE(b.map(va.value, g, c.value) == errc::ok);
  REQUIRE(b.set_access(va.value, g) == errc::ok);
  CHECK(reinterpret_cast<const unsigned char*>(va.value)[g / 2] == 0);
  // The destructor cleans up what is left mapped and created.

  CHECK_THROWS_AS(host_memfd(g, 1000), std::invalid_argument);
  CHECK_THROWS_AS(host_memfd(g + 4096, g), std::invalid_argument);
  CHECK_THROWS_AS(host_memfd(0, g), std::invalid_argument);

  host_memfd small(4 * 4096, 4096);  // page granularity
  CHECK(small.granularity() == 4096);
  host_memfd moved(std::move(small));
  auto m = moved.create(4096);
  REQUIRE(m);
  CHECK(moved.release(m.value) == errc::ok);
}

TEST_CASE("host_memfd: streams are forwarded") {
  host_memfd b(2 * mib);
  auto e = b.record(gmlake::host_stream{5});
  REQUIRE(e);
  CHECK(b.query(e.value).value);
  b.set_auto_complete(false);
  auto f = b.record(gmlake::host_stream{5});
  REQUIRE(f);
  CHECK(b.pending(gmlake::host_stream{5}));
  CHECK(!b.query(f.value).value);
  CHECK(b.synchronize(f.value) == errc::ok);
  CHECK(b.query(f.value).value);
  b.destroy(f.value);
}

// ---------------------------------------------------------------- simulated

TEST_CASE("simulated: capacity and counters") {
  const std::size_t g = 2 * mib;
  simulated b(4 * g, g);
  CHECK(b.granularity() == g);
  CHECK(b.capacity() == 4 * g);

  auto a = b.create(3 * g);
  REQUIRE(a);
  CHECK(b.create(2 * g).error == errc::out_of_memory);
  auto c = b.create(g);
  REQUIRE(c);
  CHECK(!(a.value == c.value));
  CHECK(b.created_bytes() == 4 * g);
  CHECK(b.chunk_count() == 2);
  CHECK(b.create(g).error == errc::out_of_memory);
  CHECK(b.create(0).error == errc::invalid);
  CHECK(b.create(g + 1).error == errc::invalid);

  auto va = b.reserve(4 * g);
  auto vb = b.reserve(2 * g);
  REQUIRE((va && vb));
  CHECK(va.value % g == 0);
  CHECK(va.value >= simulated::base_address);
  CHECK(vb.value >= va.value + 4 * g);  // never overlaps
  CHECK(b.reservation_count() == 2);
  CHECK(b.reserved_bytes() == 6 * g);
  CHECK(b.reserve(0).error == errc::invalid);

  CHECK(b.map(va.value, 3 * g, a.value) == errc::ok);
  CHECK(b.map(va.value + 3 * g, g, c.value) == errc::ok);
  CHECK(b.map(vb.value, g, c.value) == errc::ok);  // aliasing is fine
  CHECK(b.mapped_bytes() == 5 * g);
  CHECK(b.map(va.value + 1, g, c.value) == errc::invalid);  // misaligned
  CHECK(b.map(va.value, 2 * g, c.value) == errc::invalid);  // n != chunk size
  CHECK(b.map(0x1000, g, c.value) == errc::invalid);        // never handed out
  CHECK(b.map(va.value, g, simulated::chunk_type{99, g}) == errc::invalid);  // never created
  CHECK(b.set_access(va.value, 4 * g) == errc::ok);
  CHECK(b.set_access(va.value + 1, g) == errc::invalid);

  CHECK(b.unmap(va.value, 4 * g) == errc::ok);
  CHECK(b.unmap(vb.value, g) == errc::ok);
  CHECK(b.mapped_bytes() == 0);
  CHECK(b.unmap(vb.value, g) == errc::invalid);  // nothing mapped any more
  CHECK(b.release(a.value) == errc::ok);
  CHECK(b.created_bytes() == g);
  auto d = b.create(3 * g);
  REQUIRE(d);
  CHECK(d.value.id != a.value.id);
  CHECK(b.release(d.value) == errc::ok);
  CHECK(b.release(c.value) == errc::ok);
  CHECK(b.release(simulated::chunk_type{}) == errc::invalid);
  CHECK(b.created_bytes() == 0);
  CHECK(b.chunk_count() == 0);

  CHECK(b.address_free(va.value, 4 * g) == errc::ok);
  CHECK(b.address_free(vb.value, 2 * g) == errc::ok);
  CHECK(b.address_free(vb.value, 2 * g) == errc::invalid);  // nothing reserved any more
  CHECK(b.reservation_count() == 0);
  CHECK(b.reserved_bytes() == 0);
}

TEST_CASE("simulated: default sizes replay 100 GB without memory") {
  simulated b;
  CHECK(b.capacity() == std::size_t{1} << 40);
  CHECK(b.granularity() == 2 * mib);
  const std::size_t n = std::size_t{100} << 30;
  auto c = b.create(n);
  auto va = b.reserve(n);
  REQUIRE((c && va));
  CHECK(b.map(va.value, n, c.value) == errc::ok);
  CHECK(b.set_access(va.value, n) == errc::ok);
  CHECK(b.unmap(va.value, n) == errc::ok);
  CHECK(b.release(c.value) == errc::ok);
  CHECK(b.address_free(va.value, n) == errc::ok);
}

// ---------------------------------------------------------------- counting

TEST_CASE("counting: calls, bytes and failures per kind") {
  const std::size_t g = 2 * mib;
  counting<simulated> b(4 * g, g);
  CHECK(b.granularity() == g);
  CHECK(b.capacity() == 4 * g);

  auto c = b.create(2 * g);
  REQUIRE(c);
  CHECK(b.create(4 * g).error == errc::out_of_memory);
  auto va = b.reserve(2 * g);
  REQUIRE(va);
  CHECK(b.map(va.value, 2 * g, c.value) == errc::ok);
  CHECK(b.set_access(va.value, 2 * g) == errc::ok);
  CHECK(b.unmap(va.value, 2 * g) == errc::ok);
  CHECK(b.release(c.value) == errc::ok);
  CHECK(b.address_free(va.value, 2 * g) == errc::ok);
  CHECK(b.address_free(va.value, 2 * g) == errc::invalid);
  auto e = b.record(gmlake::host_stream{0});
  REQUIRE(e);
  CHECK(b.query(e.value).value);
  CHECK(b.synchronize(e.value) == errc::ok);
  b.destroy(e.value);

  const auto& k = b.counts();
  CHECK(k.calls_of(call::create) == 2);
  CHECK(k.bytes_of(call::create) == 6 * g);
  CHECK(k.failures_of(call::create) == 1);
  CHECK(k.calls_of(call::reserve) == 1);
  CHECK(k.bytes_of(call::reserve) == 2 * g);
  CHECK(k.calls_of(call::map) == 1);
  CHECK(k.bytes_of(call::map) == 2 * g);
  CHECK(k.calls_of(call::set_access) == 1);
  CHECK(k.calls_of(call::unmap) == 1);
  CHECK(k.bytes_of(call::unmap) == 2 * g);
  CHECK(k.calls_of(call::release) == 1);
  CHECK(k.bytes_of(call::release) == 2 * g);
  CHECK(k.calls_of(call::address_free) == 2);
  CHECK(k.failures_of(call::address_free) == 1);
  CHECK(k.calls_of(call::record) == 1);
  CHECK(k.bytes_of(call::record) == 0);
  CHECK(k.calls[static_cast<std::size_t>(call::create)] == 2);

  // Members outside the concept go through parent().
  CHECK(b.parent().created_bytes() == 0);
  b.parent().set_auto_complete(false);
  auto f = b.record(gmlake::host_stream{3});
  REQUIRE(f);
  CHECK(b.parent().pending(gmlake::host_stream{3}));
  CHECK(b.counts().calls_of(call::record) == 2);

  b.reset_counts();
  for (std::size_t i = 0; i < gmlake::call_count; ++i) {
    CHECK(b.counts().calls[i] == 0);
    CHECK(b.counts().bytes[i] == 0);
    CHECK(b.counts().failures[i] == 0);
  }
}

TEST_CASE("counting<host_memfd>: forwards to real memory") {
  const std::size_t g = 2 * mib;
  counting<host_memfd> b(2 * g, g);
  auto c = b.create(g);
  auto va = b.reserve(g);
  REQUIRE((c && va));
  REQUIRE(b.map(va.value, g, c.value) == errc::ok);
  REQUIRE(b.set_access(va.value, g) == errc::ok);
  *reinterpret_cast<int*>(va.value) = 42;
  CHECK(*reinterpret_cast<const int*>(va.value) == 42);
  CHECK(b.unmap(va.value, g) == errc::ok);
  CHECK(b.release(c.value) == errc::ok);
  CHECK(b.address_free(va.value, g) == errc::ok);
  CHECK(b.parent().created_bytes() == 0);
  CHECK(b.counts().calls_of(call::map) == 1);
  CHECK(b.counts().bytes_of(call::release) == g);
  std::uint64_t failures = 0;
  for (auto f : b.counts().failures) failures += f;
  CHECK(failures == 0);
}

// ---------------------------------------------------------------- host_streams

TEST_CASE("host_streams: auto-complete mode") {
  gmlake::detail::host_streams s;
  CHECK(s.auto_complete());
  auto e0 = s.record(gmlake::host_stream{0});
  auto e1 = s.record(gmlake::host_stream{0});
  auto e2 = s.record(gmlake::host_stream{7});
  REQUIRE((e0 && e1 && e2));
  CHECK(e1.value.ticket == e0.value.ticket + 1);
  CHECK(e2.value.stream == gmlake::host_stream{7});
  CHECK(s.query(e0.value).value);
  CHECK(s.query(e1.value).value);
  CHECK(s.query(e2.value).value);
  CHECK(!s.pending(gmlake::host_stream{0}));
  CHECK(!s.pending(gmlake::host_stream{7}));
  CHECK(s.synchronize(e1.value) == errc::ok);
  CHECK(s.query(gmlake::detail::host_streams::event_type{}).value);  // empty event: done
  CHECK(s.query({gmlake::host_stream{42}, 1}).error == errc::invalid);                    // never recorded
  CHECK(s.synchronize({gmlake::host_stream{0}, 99}) == errc::invalid);
  s.destroy(e0.value);
}

TEST_CASE("host_streams: manual mode") {
  gmlake::detail::host_streams s;
  s.set_auto_complete(false);
  auto a1 = s.record(gmlake::host_stream{1});
  auto a2 = s.record(gmlake::host_stream{1});
  auto a3 = s.record(gmlake::host_stream{1});
  auto b1 = s.record(gmlake::host_stream{2});
  REQUIRE((a1 && a2 && a3 && b1));
  CHECK(s.pending(gmlake::host_stream{1}));
  CHECK(s.pending(gmlake::host_stream{2}));
  CHECK(!s.pending(gmlake::host_stream{3}));  // never used
  CHECK(!s.query(a1.value).value);
  CHECK(s.query(a1.value).error == errc::ok);

  // synchronize finishes work up to the event, not past it, on its stream only.
  CHECK(s.synchronize(a2.value) == errc::ok);
  CHECK(s.query(a1.value).value);
  CHECK(s.query(a2.value).value);
  CHECK(!s.query(a3.value).value);
  CHECK(!s.query(b1.value).value);
  CHECK(s.synchronize(a1.value) == errc::ok);  // already done: no going back
  CHECK(s.query(a2.value).value);

  s.complete(gmlake::host_stream{1});
  CHECK(s.query(a3.value).value);
  CHECK(!s.pending(gmlake::host_stream{1}));
  CHECK(s.pending(gmlake::host_stream{2}));
  s.complete_all();
  CHECK(s.query(b1.value).value);
  CHECK(!s.pending(gmlake::host_stream{2}));

  // Back to auto: new work finishes at once.
  s.set_auto_complete(true);
  auto a4 = s.record(gmlake::host_stream{1});
  REQUIRE(a4);
  CHECK(s.query(a4.value).value);
}
