// gmlake/detail/config.hpp - build-wide switches and constants.
//
// The lowest layer: includes nothing of gmlake. Every other header may use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

/// Debug level. 0: release (no checks beyond those that keep state sound);
/// 1: misuse (double free, foreign pointer) aborts with a message;
/// 2: check_invariants() after every operation (slow; tests use it).
#ifndef GMLAKE_DEBUG
#  ifdef NDEBUG
#    define GMLAKE_DEBUG 0
#  else
#    define GMLAKE_DEBUG 1
#  endif
#endif

/// Internal assertion: active from debug level 1, prints where and why.
#if GMLAKE_DEBUG >= 1
#  define GMLAKE_ASSERT(cond, msg)                                                   \
    do {                                                                             \
      if (!(cond)) {                                                                 \
        std::fprintf(stderr, "gmlake: %s:%d: %s (%s)\n", __FILE__, __LINE__, msg, #cond); \
        std::abort();                                                                \
      }                                                                              \
    } while (0)
#else
#  define GMLAKE_ASSERT(cond, msg) ((void)0)
#endif

namespace gmlake {

/// Requests are placed inside blocks at this granularity (as PyTorch does).
inline constexpr std::size_t block_alignment = 512;

/// Rounds `n` up to a multiple of `a` (a power of two or any positive value).
constexpr std::size_t round_up(std::size_t n, std::size_t a) noexcept {
  return (n + a - 1) / a * a;
}
constexpr std::size_t round_down(std::size_t n, std::size_t a) noexcept { return n / a * a; }
/// The largest power of two that divides `n` (n > 0).
constexpr std::size_t lowest_bit(std::uintptr_t n) noexcept { return static_cast<std::size_t>(n & (~n + 1)); }

} // namespace gmlake
