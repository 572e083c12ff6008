// tests/test_conformance.cpp - the allocator contract (conformance.hpp), over every
// host backend x configuration.
#include "conformance.hpp"

#include <cstring>
#include <memory>
#include <type_traits>

namespace {

using gmlake::backend::host_memfd;
using gmlake::backend::simulated;
using namespace gmlake_conformance;

constexpr std::size_t gran = 64 * kib;
constexpr std::size_t cap = 16 * mib;

inline gmlake::options with_edges() {  // stitch edges on (options::stitch_edge_min)
  gmlake::options o = test_options();
  o.stitch_edge_min = 512;
  o.max_handle = 4 * gran;  // handles of several chunks, so that edges occur
  return o;
}

template <class Alloc, gmlake::options (*Options)() = test_options>
struct combo {
  using alloc_type = Alloc;
  using backend_type = typename Alloc::backend_type;
  static constexpr bool real = std::is_same_v<backend_type, host_memfd>;
  static std::unique_ptr<Alloc> make() { return std::make_unique<Alloc>(backend_type(cap, gran), Options()); }
  static std::size_t granularity() { return gran; }
  static std::size_t capacity() { return cap; }
  static void write(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
  static void read(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
};

} // namespace

TEST_CASE_TEMPLATE("conformance", T, combo<gmlake::gmlake_allocator<host_memfd>>,
                   combo<gmlake::bfc_allocator<host_memfd>>, combo<gmlake::expandable_allocator<host_memfd>>,
                   combo<gmlake::gmlake_paper_allocator<host_memfd>>, combo<custom_a<host_memfd>>,
                   combo<custom_b<host_memfd>>, combo<gmlake::gmlake_allocator<simulated>>,
                   combo<gmlake::bfc_allocator<simulated>>, combo<gmlake::expandable_allocator<simulated>>,
                   combo<gmlake::gmlake_paper_allocator<simulated>>, combo<custom_a<simulated>>,
                   combo<custom_b<simulated>>, combo<gmlake::gmlake_allocator<host_memfd>, with_edges>,
                   combo<gmlake::gmlake_allocator<simulated>, with_edges>) {
  run_conformance<T>();
}
