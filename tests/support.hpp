// tests/support.hpp - checks shared by the test files.
#pragma once

#include <doctest/doctest.h>

namespace gmlake_test {

/// Every test ends here: invariants hold, and after release_cached() nothing is
/// live, reserved or mapped, and no misuse was seen.
template <class A>
void check_released(A& a) {
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
  CHECK(s.invalid_frees == 0);
}

} // namespace gmlake_test
