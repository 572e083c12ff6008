// consumer.cpp - a program outside gmlake's source tree that uses it through one
// of its front doors (Meson subproject, pkg-config, CMake find_package): the
// umbrella header, one host backend, the allocator and a std::pmr container.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

#include <cstdio>
#include <cstring>
#include <memory_resource>
#include <vector>

int main() {
  static_assert(__cplusplus >= 202002L, "the front door must give C++20");
  using allocator = gmlake::basic_allocator<gmlake::backend::host_memfd>;
  allocator a(gmlake::backend::host_memfd(std::size_t{64} << 20));
  const std::size_t n = std::size_t{3} << 20;
  void* p = a.allocate(n);
  std::memset(p, 0x5a, n);
  a.deallocate(p, n);
  {
    gmlake::memory_resource mr(a, gmlake::host_stream{1});  // a std::pmr view on stream 1
    std::pmr::vector<int> v(&mr);
    for (int i = 0; i < 1000; ++i) v.push_back(i);
    if (v[999] != 999) return 1;
  }
  const gmlake::statistics s = a.stats();
  const bool ok = s.allocations.current == 0 && s.active_bytes.peak >= static_cast<std::int64_t>(n) &&
                  a.check_invariants();
  std::printf("consumer: C++ %ld, gmlake peak active %lld bytes, reserved %lld bytes: %s\n",
              static_cast<long>(__cplusplus), static_cast<long long>(s.active_bytes.peak),
              static_cast<long long>(s.reserved_bytes.current), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
