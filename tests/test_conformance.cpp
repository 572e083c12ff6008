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

template <class Alloc>
typename Alloc::stitch_type default_policy() {
  return {};
}
inline gmlake::policy::best_fit_pieces with_edges() {  // stitch edges on
  gmlake::policy::best_fit_pieces p;
  p.edges = 512;
  p.grow.max_chunk = 4 * gran;  // chunks of several slots, so that edges occur
  return p;
}

template <class Alloc, typename Alloc::stitch_type (*Policy)() = default_policy<Alloc>>
struct combo {
  using alloc_type = Alloc;
  using backend_type = typename Alloc::backend_type;
  static constexpr bool real = std::is_same_v<backend_type, host_memfd>;
  static std::unique_ptr<Alloc> make() {
    return std::make_unique<Alloc>(backend_type(cap, gran), test_options(), Policy());
  }
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
