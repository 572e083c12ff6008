// The simulated backend's addresses have no memory behind them: a std::pmr view,
// whose containers write to what they get, must not accept it (nor a decorator on it).
// expect: BackendMemoryAccessible
#include <gmlake/gmlake.hpp>
#include <gmlake/backend/host_memfd.hpp>

#include <memory_resource>
#include <vector>

#ifdef GMLAKE_COMPILE_OK
using backend = gmlake::backend::counting<gmlake::backend::host_memfd>;
#else
using backend = gmlake::backend::counting<gmlake::backend::simulated>;
#endif

void f(gmlake::allocator<backend>& a) {
  gmlake::memory_resource mr(a);
  std::pmr::vector<int> v(&mr);
  v.push_back(1);
}
