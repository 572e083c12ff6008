// A std::pmr container on gmlake, on the host backend that really maps memory:
// vectors grow, free their old buffers, and a large request is served by
// stitching the freed chunks instead of reserving more.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

#include <cstdio>
#include <memory_resource>
#include <vector>

int main() {
  constexpr std::size_t chunk = 64 << 10;  // small chunks so the example stays small
  gmlake::options opt;
  opt.small_max = 16 << 10;
  gmlake::allocator<gmlake::backend::host_memfd> a(gmlake::backend::host_memfd(64 << 20, chunk), opt);
  gmlake::memory_resource mr(a);  // a std::pmr view of `a`, on the default stream

  // Four blocks of two chunks; free every other one: 4 chunks free, none adjacent.
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(mr.allocate(2 * chunk));
  mr.deallocate(blocks[0], 2 * chunk);
  mr.deallocate(blocks[2], 2 * chunk);
  const auto before = mr.allocator().stats().reserved_bytes.current;

  {
    std::pmr::vector<int> v(&mr);
    v.resize(4 * chunk / sizeof(int) - 64);  // needs 4 contiguous chunks
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i);
    long long sum = 0;
    for (int x : v) sum += x;
    const auto s = mr.allocator().stats();
    std::printf("vector of %zu ints, sum %lld\n", v.size(), sum);
    std::printf("reserved before %lld, after %lld; stitched requests: %llu\n", (long long)before,
                (long long)s.reserved_bytes.current, (unsigned long long)s.fit[2]);
  }
  mr.deallocate(blocks[1], 2 * chunk);
  mr.deallocate(blocks[3], 2 * chunk);
  mr.allocator().release_cached();
  std::printf("invariants %s, reserved after release_cached %lld\n", mr.allocator().check_invariants() ? "ok" : "BROKEN",
              (long long)mr.allocator().stats().reserved_bytes.current);
}
