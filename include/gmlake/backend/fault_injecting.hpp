// gmlake/backend/fault_injecting.hpp - a PhysicalBackend decorator that makes chosen
// calls fail, for testing how the layers above survive backend failures.
//
// What holds for all of it:
//  - `fault_injecting<Parent>` is a forwarding<Parent> (backend/forwarding.hpp): it
//    forwards every concept call to its parent unchanged, except the one call (or the calls, in `sticky` mode) it
//    is told to fail: that call returns the planned error and never reaches the
//    parent, so the parent's state is as if the call had not been made (the contract
//    of every backend: a failed call changes nothing);
//  - calls are counted per `fault` kind from construction (or `reset_counts()`),
//    injected failures included, so a test can run a scenario clean once to learn
//    the totals and then fail each call of it in turn;
//  - kinds: reserve, create, map, set_access, unmap, and event (record, query and
//    synchronize together). address_free, release and destroy are cleanup calls
//    whose results the allocator cannot act on; they are forwarded, never failed;
//  - every call is `noexcept`, as the concept asks; members of the parent outside
//    the concept are reached through `parent()`.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "../concepts.hpp"
#include "../errors.hpp"
#include "forwarding.hpp"

namespace gmlake::backend {

/// The kinds of backend call a fault can be injected into.
enum class fault : unsigned char { reserve = 0, create, map, set_access, unmap, event, count_ };
inline constexpr std::size_t fault_count = static_cast<std::size_t>(fault::count_);
inline constexpr std::array<const char*, fault_count> fault_names = {"reserve", "create",     "map",
                                                                      "set_access", "unmap", "event"};

/// The error a real driver would give for a failed call of kind k: out of memory
/// for reserve and create, a driver error for the rest.
constexpr errc default_error(fault k) noexcept {
  return k == fault::reserve || k == fault::create ? errc::out_of_memory : errc::driver;
}

/// Fails the n-th call of a chosen kind (and, when sticky, every later one of that
/// kind), then forwards to `Parent` (a backend, or a pointer to one it does not own).
template <class Parent>
class fault_injecting : public forwarding<Parent> {
  using base = forwarding<Parent>;

 public:
  using typename base::chunk_type;
  using typename base::event_type;
  using typename base::parent_type;
  using typename base::stream_type;

  /// What to fail: the `nth` call (1-based; 0: none) of kind `kind`, with `error`.
  struct plan {
    fault kind = fault::create;
    std::uint64_t nth = 0;
    errc error = errc::driver;
    bool sticky = false;  ///< also fail every later call of that kind
  };

  /// @brief Makes the parent from `args`; no fault is planned.
  using base::base;
  using base::parent;

  /// @brief Plans the failure of the `nth` call of kind `k`, counted since construction
  ///        or the last reset_counts() (injected failures included). `nth` == 0 disarms.
  void fail_at(fault k, std::uint64_t nth, errc error, bool sticky = false) noexcept {
    plan_ = plan{k, nth, error, sticky};
  }
  void fail_at(fault k, std::uint64_t nth) noexcept { fail_at(k, nth, default_error(k)); }
  /// @brief No more failures.
  void disarm() noexcept { plan_.nth = 0; }

  [[nodiscard]] const plan& planned() const noexcept { return plan_; }
  /// Calls of kind k so far (injected failures included).
  [[nodiscard]] std::uint64_t calls(fault k) const noexcept { return calls_[index(k)]; }
  /// All calls of the kinds that can fail.
  [[nodiscard]] std::uint64_t total_calls() const noexcept {
    std::uint64_t n = 0;
    for (auto c : calls_) n += c;
    return n;
  }
  /// Failures injected so far.
  [[nodiscard]] std::uint64_t injected() const noexcept { return injected_; }
  void reset_counts() noexcept {
    calls_ = {};
    injected_ = 0;
  }

  // The calls that can fail; the others are forwarded by the base.
  [[nodiscard]] result<std::uintptr_t> reserve(std::size_t n) noexcept {
    if (errc e = hit(fault::reserve); e != errc::ok) return e;
    return parent().reserve(n);
  }
  [[nodiscard]] result<chunk_type> create(std::size_t n) noexcept {
    if (errc e = hit(fault::create); e != errc::ok) return e;
    return parent().create(n);
  }
  [[nodiscard]] errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept {
    if (errc e = hit(fault::map); e != errc::ok) return e;
    return parent().map(va, n, c);
  }
  [[nodiscard]] errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    if (errc e = hit(fault::set_access); e != errc::ok) return e;
    return parent().set_access(va, n);
  }
  [[nodiscard]] errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    if (errc e = hit(fault::unmap); e != errc::ok) return e;
    return parent().unmap(va, n);
  }
  [[nodiscard]] result<event_type> record(stream_type s) noexcept {
    if (errc e = hit(fault::event); e != errc::ok) return e;
    return parent().record(s);
  }
  [[nodiscard]] result<bool> query(event_type e) noexcept {
    if (errc x = hit(fault::event); x != errc::ok) return x;
    return parent().query(e);
  }
  [[nodiscard]] errc synchronize(event_type e) noexcept {
    if (errc x = hit(fault::event); x != errc::ok) return x;
    return parent().synchronize(e);
  }

 private:
  static constexpr std::size_t index(fault k) noexcept { return static_cast<std::size_t>(k); }

  /// Counts a call of kind k; the planned error if this is the one to fail, else ok.
  errc hit(fault k) noexcept {
    const std::uint64_t n = ++calls_[index(k)];
    if (plan_.nth == 0 || plan_.kind != k || n < plan_.nth || (n > plan_.nth && !plan_.sticky)) return errc::ok;
    ++injected_;
    return plan_.error;
  }

  plan plan_{};
  std::array<std::uint64_t, fault_count> calls_{};
  std::uint64_t injected_ = 0;
};

// Its models, fault_injecting<simulated> and fault_injecting<host_memfd>, are
// static_asserted in tests/test_faults.cpp, so that this header needs neither backend.

} // namespace gmlake::backend
