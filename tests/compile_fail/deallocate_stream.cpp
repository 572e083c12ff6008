// A size passed where deallocate takes the stream does not compile either.
// expect: host_stream
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

void f(gmlake::allocator<gmlake::backend::host_memfd>& a, void* p) {
#ifdef GMLAKE_COMPILE_OK
  a.deallocate(p, 1000, gmlake::host_stream{7});
#else
  a.deallocate(p, 1000, 7);
#endif
}
