// tests/test_policies.cpp - policy models on the views they are given, with no
// allocator: the fit strategies over a free_view, the eviction policies over
// stitch_cache_entries; and the forwarding decorator base.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gmlake/backend/counting.hpp"
#include "gmlake/backend/forwarding.hpp"
#include "gmlake/backend/simulated.hpp"
#include "gmlake/policy/eviction.hpp"
#include "gmlake/policy/fit.hpp"

namespace {

using gmlake::free_range;
using gmlake::free_view;
using gmlake::stitch_cache_entries;
using gmlake::stitch_info;
namespace policy = gmlake::policy;

/// Free ranges given in the view's order (smallest first), each with a key.
struct ranges {
  std::vector<free_range> v;
  std::size_t at = 0;
  std::size_t yielded = 0;
  explicit ranges(std::vector<free_range> r) : v(std::move(r)) {
    for (auto& x : v) x.key = &x;
  }
  free_view view() {
    return free_view(this, [](void* self, free_range& out) noexcept {
      auto& r = *static_cast<ranges*>(self);
      if (r.at == r.v.size()) return false;
      out = r.v[r.at++];
      ++r.yielded;
      return true;
    });
  }
};

} // namespace

TEST_CASE("best_fit takes the first usable range of the view, looking at most max_scan past the first") {
  ranges r({{0x3000, 1024, false}, {0x1000, 2048, true}, {0x2000, 4096, true}});
  auto v = r.view();
  CHECK(policy::best_fit{}.pick(v).addr == 0x1000);
  CHECK(r.yielded == 2);  // stops once it has chosen
  ranges none({{0x3000, 1024, false}, {0x1000, 2048, false}});
  auto w = none.view();
  CHECK(policy::best_fit{1}.pick(w).key == nullptr);
  ranges far({{0x3000, 1024, false}, {0x1000, 2048, false}, {0x2000, 4096, true}});
  auto x = far.view();
  CHECK(policy::best_fit{1}.pick(x).key == nullptr);  // the usable one is past the scan
}

TEST_CASE("low_address_fit takes the lowest address among the first `window` usable ranges") {
  ranges r({{0x5000, 1024, true}, {0x9000, 1024, false}, {0x1000, 2048, true}, {0x0800, 4096, true}});
  auto v = r.view();
  CHECK(policy::low_address_fit{2, 64}.pick(v).addr == 0x1000);
  ranges s({{0x5000, 1024, true}, {0x9000, 1024, false}, {0x1000, 2048, true}, {0x0800, 4096, true}});
  auto w = s.view();
  CHECK(policy::low_address_fit{8, 64}.pick(w).addr == 0x0800);
}

namespace {

/// Cached blocks by hand: by_age in the order given, by_size by bytes descending.
struct cached {
  std::vector<stitch_info> by_age, by_size;
  stitch_cache_entries entries() const {
    return stitch_cache_entries(this, by_age.size(),
                                [](const void* self, stitch_cache_entries::order o, std::size_t i) noexcept {
                                  const auto& c = *static_cast<const cached*>(self);
                                  return o == stitch_cache_entries::by_age ? c.by_age[i] : c.by_size[i];
                                });
  }
};

} // namespace

TEST_CASE("eviction policies pick their victim from the cache's entries") {
  const stitch_info old_small{10, 1, 0xA}, new_big{30, 2, 0xB};
  const cached c{{old_small, new_big}, {new_big, old_small}};
  CHECK(policy::lru{}.victim(c.entries()).pointer == 0xA);
  CHECK(policy::no_cache{}.victim(c.entries()).pointer == 0xA);
  CHECK(policy::evict_largest{}.victim(c.entries()).pointer == 0xB);
  const stitch_info old_big{30, 1, 0xC};
  const cached d{{old_big, new_big}, {new_big, old_big}};
  CHECK(policy::evict_largest{}.victim(d.entries()).pointer == 0xC);  // as large: the older goes
  CHECK(policy::lru{0, 4096}.over_capacity({1, 1, 1}));
  CHECK(!policy::lru{}.over_capacity({1, 1, 1}));
  CHECK(policy::no_cache{}.over_capacity({1, 0, 0}));
}

namespace {

/// A decorator that changes one call: create fails above a size.
template <class Parent>
class capped : public gmlake::backend::forwarding<Parent> {
 public:
  using base = gmlake::backend::forwarding<Parent>;
  using base::base;
  using typename base::chunk_type;
  std::size_t limit = 0;
  [[nodiscard]] gmlake::result<chunk_type> create(std::size_t n) noexcept {
    if (n > limit) return gmlake::errc::out_of_memory;
    return this->parent().create(n);
  }
};
static_assert(gmlake::PhysicalBackend<capped<gmlake::backend::simulated>>);
static_assert(gmlake::PhysicalBackend<capped<gmlake::backend::simulated*>>);
static_assert(gmlake::PhysicalBackend<gmlake::backend::counting<gmlake::backend::simulated*>>);

} // namespace

TEST_CASE("forwarding: a decorator declares only the call it changes, by value or over a borrowed backend") {
  using gmlake::backend::simulated;
  capped<simulated> c(std::size_t{64} << 20, std::size_t{1} << 20);
  c.limit = std::size_t{2} << 20;
  CHECK(c.granularity() == std::size_t{1} << 20);
  CHECK(!c.create(std::size_t{4} << 20));
  auto ok = c.create(std::size_t{2} << 20);
  REQUIRE(ok);
  CHECK(c.parent().created_bytes() == std::size_t{2} << 20);
  CHECK(c.release(ok.value) == gmlake::errc::ok);

  simulated owned(std::size_t{64} << 20, std::size_t{1} << 20);
  gmlake::backend::counting<simulated*> counted(&owned);
  auto va = counted.reserve(std::size_t{4} << 20);
  REQUIRE(va);
  CHECK(counted.address_free(va.value, std::size_t{4} << 20) == gmlake::errc::ok);
  CHECK(counted.counts().calls_of(gmlake::call::reserve) == 1);
  CHECK(&counted.parent() == &owned);
}
