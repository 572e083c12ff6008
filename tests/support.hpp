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

#include <gmlake/backend/forwarding.hpp>

namespace gmlake_test {

/// A backend that forwards every call to one it does not own, so that a test can
/// look at the real backend (and a counting decorator on it) after the allocator
/// that used it is gone: "nothing leaked, even through the destructor".
template <class P>
class borrowed : public gmlake::backend::forwarding<P*> {
 public:
  explicit borrowed(P* p) noexcept : gmlake::backend::forwarding<P*>(p) {}
  [[nodiscard]] P& target() const noexcept { return const_cast<P&>(this->parent()); }
};

} // namespace gmlake_test
