// tests/support.hpp - checks shared by the test files.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>

namespace gmlake_test {

/// Every test ends here: invariants hold, and after release_cached() nothing is
/// live, reserved or mapped, and no misuse was seen but the `invalid_frees` the
/// test made on purpose.
template <class A>
void check_released(A& a, std::uint64_t invalid_frees = 0) {
  CHECK(a.check_invariants());
  (void)a.release_cached();
  CHECK(a.check_invariants());
  const auto s = a.stats();
  CHECK(s.allocations.current == 0);
  CHECK(s.active_bytes.current == 0);
  CHECK(s.requested_bytes.current == 0);
  CHECK(s.reserved_bytes.current == 0);
  CHECK(s.mapped_bytes.current == 0);
  CHECK(s.chunks.current == 0);
  CHECK(s.stitched_blocks.current == 0);
  CHECK(s.invalid_frees == invalid_frees);
}

} // namespace gmlake_test

#include <cstddef>
#include <cstdint>

#include <gmlake/concepts.hpp>

namespace gmlake_test {

/// A backend that forwards every call to one it does not own, so that a test can
/// look at the real backend (and a counting decorator on it) after the allocator
/// that used it is gone: "nothing leaked, even through the destructor".
template <class P>
class borrowed {
 public:
  using chunk_type = typename P::chunk_type;
  using stream_type = typename P::stream_type;
  using event_type = typename P::event_type;

  explicit borrowed(P* p) noexcept : p_(p) {}
  [[nodiscard]] P& target() const noexcept { return *p_; }

  [[nodiscard]] std::size_t granularity() const noexcept { return p_->granularity(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return p_->capacity(); }
  [[nodiscard]] gmlake::result<std::uintptr_t> reserve(std::size_t n) noexcept { return p_->reserve(n); }
  [[nodiscard]] gmlake::errc address_free(std::uintptr_t va, std::size_t n) noexcept { return p_->address_free(va, n); }
  [[nodiscard]] gmlake::result<chunk_type> create(std::size_t n) noexcept { return p_->create(n); }
  [[nodiscard]] gmlake::errc release(chunk_type c) noexcept { return p_->release(c); }
  [[nodiscard]] gmlake::errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept { return p_->map(va, n, c); }
  [[nodiscard]] gmlake::errc set_access(std::uintptr_t va, std::size_t n) noexcept { return p_->set_access(va, n); }
  [[nodiscard]] gmlake::errc unmap(std::uintptr_t va, std::size_t n) noexcept { return p_->unmap(va, n); }
  [[nodiscard]] gmlake::result<event_type> record(stream_type s) noexcept { return p_->record(s); }
  [[nodiscard]] gmlake::result<bool> query(event_type e) noexcept { return p_->query(e); }
  [[nodiscard]] gmlake::errc synchronize(event_type e) noexcept { return p_->synchronize(e); }
  void destroy(event_type e) noexcept { p_->destroy(e); }

 private:
  P* p_;
};

} // namespace gmlake_test
