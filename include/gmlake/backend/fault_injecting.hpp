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
//  - kinds: reserve, create, map, set_access, unmap, event (record, query and
//    synchronize together), release and address_free: every call that can fail
//    (destroy cannot). Two planned failures may be armed at once (a step and its
//    undo), or a random fraction of the calls of chosen kinds (fail_randomly);
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
enum class fault : unsigned char { reserve = 0, create, map, set_access, unmap, event, release, address_free, count_ };
inline constexpr std::size_t fault_count = static_cast<std::size_t>(fault::count_);
inline constexpr std::array<const char*, fault_count> fault_names = {
    "reserve", "create", "map", "set_access", "unmap", "event", "release", "address_free"};
/// A set of kinds, for fail_randomly: bit k is fault k.
inline constexpr unsigned every_fault = (1u << fault_count) - 1;
constexpr unsigned fault_bit(fault k) noexcept { return 1u << static_cast<unsigned>(k); }

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
  ///        Replaces every plan (the second one and random failures included).
  void fail_at(fault k, std::uint64_t nth, errc error, bool sticky = false) noexcept {
    plan_ = plan{k, nth, error, sticky};
    also_ = plan{};
    then_ = false;
    rate_ = 0;
  }
  void fail_at(fault k, std::uint64_t nth) noexcept { fail_at(k, nth, default_error(k)); }
  /// @brief Plans a second failure besides fail_at's (a step and, say, its undo):
  ///        the `nth` call of kind `k` (counted as for fail_at) fails once.
  void also_fail_at(fault k, std::uint64_t nth) noexcept {
    also_ = plan{k, nth, default_error(k), false};
    then_ = false;
  }
  /// @brief Once fail_at's failure is injected, fails the next call of kind `k` once:
  ///        a step and then its undo (a map, then the rollback's unmap).
  void then_fail(fault k) noexcept {
    also_ = plan{k, 0, default_error(k), false};
    then_ = true;
  }
  /// @brief Fails each call of the kinds in `kinds` (fault_bit) with probability
  ///        `rate` (0 to 1), drawn from a generator seeded with `seed`; the plans
  ///        of fail_at and also_fail_at are dropped.
  void fail_randomly(double rate, std::uint64_t seed, unsigned kinds = every_fault) noexcept {
    plan_ = also_ = plan{};
    then_ = false;
    rate_ = rate;
    rng_ = seed * 0x9E3779B97F4A7C15ull + 1;
    kinds_ = kinds;
  }
  /// @brief No more failures.
  void disarm() noexcept {
    plan_.nth = 0;
    also_.nth = 0;
    then_ = false;
    rate_ = 0;
  }

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
  [[nodiscard]] errc release(chunk_type c) noexcept {
    if (errc e = hit(fault::release); e != errc::ok) return e;
    return parent().release(c);
  }
  [[nodiscard]] errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    if (errc e = hit(fault::address_free); e != errc::ok) return e;
    return parent().address_free(va, n);
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
    for (const plan* p : {&plan_, &also_}) {
      if (p->nth == 0 || p->kind != k || n < p->nth || (n > p->nth && !p->sticky)) continue;
      ++injected_;
      if (p == &plan_ && then_) {  // arm the second failure: the next call of its kind
        then_ = false;
        also_.nth = calls_[index(also_.kind)] + 1;
      }
      return p->error;
    }
    if (rate_ > 0 && (kinds_ & fault_bit(k)) != 0) {
      rng_ ^= rng_ >> 12;  // xorshift64*
      rng_ ^= rng_ << 25;
      rng_ ^= rng_ >> 27;
      const std::uint64_t x = rng_ * 0x2545F4914F6CDD1Dull;
      if (static_cast<double>(x >> 11) * 0x1.0p-53 < rate_) {
        ++injected_;
        return default_error(k);
      }
    }
    return errc::ok;
  }

  plan plan_{};
  plan also_{};
  bool then_ = false;  // also_ is armed when plan_ fires
  double rate_ = 0;
  std::uint64_t rng_ = 1;
  unsigned kinds_ = every_fault;
  std::array<std::uint64_t, fault_count> calls_{};
  std::uint64_t injected_ = 0;
};

// Its models, fault_injecting<simulated> and fault_injecting<host_memfd>, are
// static_asserted in tests/test_faults.cpp, so that this header needs neither backend.

} // namespace gmlake::backend
