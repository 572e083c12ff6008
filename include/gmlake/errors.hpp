// gmlake/errors.hpp - how failure is reported.
//
// Backends and policies never throw: they return an `errc` or a `result<T>`.
// The allocator turns failure into `nullptr` (try_allocate) or one of the
// exceptions below (allocate, and the std::pmr edge).
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

#include "detail/config.hpp"

namespace gmlake {

/// Why a backend call failed.
enum class errc : unsigned char {
  ok = 0,
  out_of_memory,   ///< no physical memory (or address space) left
  invalid,         ///< bad argument (misaligned, unknown handle, ...)
  driver,          ///< any other failure of the layer below
};

/// A value or the reason there is none. Trivial on purpose: no exceptions, no heap.
template <class T>
struct result {
  T value{};
  errc error = errc::ok;

  constexpr result() = default;
  constexpr result(T v) noexcept : value(v) {}              // NOLINT: implicit on purpose
  constexpr result(errc e) noexcept : error(e) {}           // NOLINT
  constexpr explicit operator bool() const noexcept { return error == errc::ok; }
};

/// Thrown by `allocate` / `std::pmr::memory_resource::allocate` when a request
/// cannot be served even after releasing every cached byte. The allocator's
/// state is as before the call.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::size_t bytes) noexcept : bytes_(bytes) {}
  /// The size of the request that failed, in bytes.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] const char* what() const noexcept override { return "gmlake: out of memory"; }

 private:
  std::size_t bytes_;
};

/// Thrown at the std::pmr edge for an alignment that is not a power of two or
/// is larger than the allocator's max_alignment() (by default the chunk size).
class bad_alignment : public std::bad_alloc {
 public:
  explicit bad_alignment(std::size_t alignment) noexcept : alignment_(alignment) {}
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] const char* what() const noexcept override {
    return "gmlake: alignment not a power of two or larger than the allocator's max_alignment()";
  }

 private:
  std::size_t alignment_;
};

/// A failure of the layer below that is not a lack of memory (a driver error).
class backend_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

} // namespace gmlake
