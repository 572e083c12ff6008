// The argument-order trap: on a host backend, allocate(bytes, stream, alignment)
// must not take an alignment for the stream.
// expect: host_stream
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

void f(gmlake::allocator<gmlake::backend::host_memfd>& a) {
#ifdef GMLAKE_COMPILE_OK
  void* p = a.allocate(1000, {}, 4096);
#else
  void* p = a.allocate(1000, 4096);
#endif
  a.deallocate(p, 1000);
}
