// gmlake/backend/counting.hpp - a PhysicalBackend decorator that counts the calls made.
//
// What holds for all of it:
//  - `counting<Parent>` is a forwarding<Parent> (backend/forwarding.hpp): every
//    concept call reaches the parent unchanged, at the same cost plus a few increments;
//  - per kind of call (gmlake::call: reserve, address_free, create, release, map,
//    set_access, unmap, record) it counts every call once (one unmap over several
//    chunks is one call), the bytes asked for, and the
//    calls that failed. Bytes are those of the request, counted whether or not it
//    succeeded; `record` has no bytes, and `release` counts `c.size` only when the
//    parent's chunk_type has a `size` member (both host backends' do);
//  - `query`, `synchronize`, `destroy` are forwarded uncounted;
//  - the allocator counts its own calls (statistics::calls) with one of these over
//    its backend, so every call is counted in this one place.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "../concepts.hpp"
#include "../errors.hpp"
#include "../stats.hpp"
#include "forwarding.hpp"

namespace gmlake::backend {

/// Counts the backend calls made through it, then forwards them to `Parent` (a
/// backend, or a pointer to one it does not own).
template <class Parent>
class counting : public forwarding<Parent> {
  using base = forwarding<Parent>;

 public:
  using typename base::chunk_type;
  using typename base::event_type;
  using typename base::parent_type;
  using typename base::stream_type;

  /// Calls, bytes and failures, indexed by `static_cast<std::size_t>(gmlake::call)`.
  struct call_counts {
    std::array<std::uint64_t, call_count> calls{};
    std::array<std::uint64_t, call_count> bytes{};
    std::array<std::uint64_t, call_count> failures{};

    [[nodiscard]] std::uint64_t calls_of(call k) const noexcept { return calls[index(k)]; }
    [[nodiscard]] std::uint64_t bytes_of(call k) const noexcept { return bytes[index(k)]; }
    [[nodiscard]] std::uint64_t failures_of(call k) const noexcept { return failures[index(k)]; }
  };

  using base::base;
  using base::parent;

  /// @brief What has been counted since construction or the last reset_counts().
  [[nodiscard]] const call_counts& counts() const noexcept { return counts_; }
  void reset_counts() noexcept { counts_ = call_counts{}; }

  [[nodiscard]] result<std::uintptr_t> reserve(std::size_t n) noexcept {
    result<std::uintptr_t> r = parent().reserve(n);
    note(call::reserve, n, r.error);
    return r;
  }
  [[nodiscard]] errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    return note(call::address_free, n, parent().address_free(va, n));
  }
  [[nodiscard]] result<chunk_type> create(std::size_t n) noexcept {
    result<chunk_type> r = parent().create(n);
    note(call::create, n, r.error);
    return r;
  }
  [[nodiscard]] errc release(chunk_type c) noexcept {
    std::size_t n = 0;
    if constexpr (requires { static_cast<std::size_t>(c.size); }) n = static_cast<std::size_t>(c.size);
    return note(call::release, n, parent().release(c));
  }
  [[nodiscard]] errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept {
    return note(call::map, n, parent().map(va, n, c));
  }
  [[nodiscard]] errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    return note(call::set_access, n, parent().set_access(va, n));
  }
  [[nodiscard]] errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    return note(call::unmap, n, parent().unmap(va, n));
  }
  [[nodiscard]] result<event_type> record(stream_type s) noexcept {
    result<event_type> r = parent().record(s);
    note(call::record, 0, r.error);
    return r;
  }

 private:
  static constexpr std::size_t index(call k) noexcept { return static_cast<std::size_t>(k); }

  errc note(call k, std::size_t n, errc e) noexcept {
    const std::size_t i = index(k);
    ++counts_.calls[i];
    counts_.bytes[i] += n;
    if (e != errc::ok) ++counts_.failures[i];
    return e;
  }

  call_counts counts_{};
};

// Its models, counting<simulated> and counting<host_memfd>, are static_asserted in
// tests/test_backends.cpp, so that this header needs neither backend.

} // namespace gmlake::backend
