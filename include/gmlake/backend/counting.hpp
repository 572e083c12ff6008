// gmlake/backend/counting.hpp - a PhysicalBackend decorator that counts the calls made.
//
// What holds for all of it:
//  - `counting<Parent>` holds its Parent by value and forwards every concept call to
//    it unchanged: same results, same errors, same cost plus a few increments;
//  - per kind of call (gmlake::call: reserve, address_free, create, release, map,
//    set_access, unmap, record) it counts every call, the bytes asked for, and the
//    calls that failed. Bytes are those of the request, counted whether or not it
//    succeeded; `record` has no bytes, and `release` counts `c.size` only when the
//    parent's chunk_type has a `size` member (both host backends' do);
//  - `query`, `synchronize`, `destroy` are forwarded uncounted;
//  - members of the parent outside the concept (test hooks, inspection) are reached
//    only through `parent()`.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "../concepts.hpp"
#include "../errors.hpp"
#include "../stats.hpp"

namespace gmlake::backend {

/// Counts the backend calls made through it, then forwards them to `Parent`.
template <PhysicalBackend Parent>
class counting {
 public:
  using parent_type = Parent;
  using chunk_type = typename Parent::chunk_type;
  using stream_type = typename Parent::stream_type;
  using event_type = typename Parent::event_type;

  /// Calls, bytes and failures, indexed by `static_cast<std::size_t>(gmlake::call)`.
  struct call_counts {
    std::array<std::uint64_t, call_count> calls{};
    std::array<std::uint64_t, call_count> bytes{};
    std::array<std::uint64_t, call_count> failures{};

    [[nodiscard]] std::uint64_t calls_of(call k) const noexcept { return calls[index(k)]; }
    [[nodiscard]] std::uint64_t bytes_of(call k) const noexcept { return bytes[index(k)]; }
    [[nodiscard]] std::uint64_t failures_of(call k) const noexcept { return failures[index(k)]; }
  };

  /// @brief Makes the parent from `args`.
  template <class... A> requires std::constructible_from<Parent, A...>
  explicit counting(A&&... args) noexcept(noexcept(Parent(std::forward<A>(args)...)))
      : parent_(std::forward<A>(args)...) {}

  /// @brief The decorated backend, for its members outside the concept.
  [[nodiscard]] Parent& parent() noexcept { return parent_; }
  [[nodiscard]] const Parent& parent() const noexcept { return parent_; }

  /// @brief What has been counted since construction or the last reset_counts().
  [[nodiscard]] const call_counts& counts() const noexcept { return counts_; }
  void reset_counts() noexcept { counts_ = call_counts{}; }

  // ------------------------------------------------------------ BackendSizes

  [[nodiscard]] std::size_t granularity() const noexcept { return parent_.granularity(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return parent_.capacity(); }

  // ------------------------------------------------------------ BackendAddressSpace

  [[nodiscard]] result<std::uintptr_t> reserve(std::size_t n) noexcept {
    result<std::uintptr_t> r = parent_.reserve(n);
    note(call::reserve, n, r.error);
    return r;
  }
  [[nodiscard]] errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    return note(call::address_free, n, parent_.address_free(va, n));
  }

  // ------------------------------------------------------------ BackendChunks

  [[nodiscard]] result<chunk_type> create(std::size_t n) noexcept {
    result<chunk_type> r = parent_.create(n);
    note(call::create, n, r.error);
    return r;
  }
  [[nodiscard]] errc release(chunk_type c) noexcept {
    std::size_t n = 0;
    if constexpr (requires { static_cast<std::size_t>(c.size); }) n = static_cast<std::size_t>(c.size);
    return note(call::release, n, parent_.release(c));
  }

  // ------------------------------------------------------------ BackendMapping

  [[nodiscard]] errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept {
    return note(call::map, n, parent_.map(va, n, c));
  }
  [[nodiscard]] errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    return note(call::set_access, n, parent_.set_access(va, n));
  }
  [[nodiscard]] errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    return note(call::unmap, n, parent_.unmap(va, n));
  }

  // ------------------------------------------------------------ BackendStreams

  [[nodiscard]] result<event_type> record(stream_type s) noexcept {
    result<event_type> r = parent_.record(s);
    note(call::record, 0, r.error);
    return r;
  }
  [[nodiscard]] result<bool> query(event_type e) noexcept { return parent_.query(e); }
  [[nodiscard]] errc synchronize(event_type e) noexcept { return parent_.synchronize(e); }
  void destroy(event_type e) noexcept { parent_.destroy(e); }

  // ------------------------------------------------------------ BackendDiagnostics (if the parent has it)

  [[nodiscard]] const char* failure() const noexcept requires BackendDiagnostics<Parent> { return parent_.failure(); }
  void clear_failure() noexcept requires BackendDiagnostics<Parent> { parent_.clear_failure(); }

 private:
  static constexpr std::size_t index(call k) noexcept { return static_cast<std::size_t>(k); }

  errc note(call k, std::size_t n, errc e) noexcept {
    const std::size_t i = index(k);
    ++counts_.calls[i];
    counts_.bytes[i] += n;
    if (e != errc::ok) ++counts_.failures[i];
    return e;
  }

  Parent parent_;
  call_counts counts_{};
};

// Its models, counting<simulated> and counting<host_memfd>, are static_asserted in
// tests/test_backends.cpp, so that this header needs neither backend.

} // namespace gmlake::backend
