// A std::pmr view's stream is fixed: it cannot be re-pointed by assignment while
// containers use it (make another view with on(stream) instead).
// expect: deleted
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

void f(gmlake::allocator<gmlake::backend::host_memfd>& a) {
  gmlake::memory_resource on0(a);
#ifdef GMLAKE_COMPILE_OK
  gmlake::memory_resource on1 = on0.on(gmlake::host_stream{1});
#else
  on0 = on0.on(gmlake::host_stream{1});
#endif
}
