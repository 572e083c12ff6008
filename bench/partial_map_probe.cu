// bench/partial_map_probe.cu - can the driver map part of a physical handle?
//
// A stitch that maps the free slots of a partly used chunk needs cuMemMap with a
// nonzero offset into the handle. This probe creates one 512 MiB handle, maps it
// whole, then tries to map single granules of it at offsets into a second
// reservation, and times map + one cuMemSetAccess over k parts of one handle
// against k handles of one granule each. It prints every failing call.
//
//   nvcc -O2 -o partial_map_probe bench/partial_map_probe.cu -lcuda && ./partial_map_probe
//
// On the H200 (driver 580.159, CUDA 13.0) every nonzero offset fails with
// CUDA_ERROR_NOT_SUPPORTED (801); cuda.h documents the parameter as "currently
// must be zero" (bench/results/h200-partial-map.txt). gmlake therefore stitches
// whole chunks.
#include <cuda.h>

#include "probe.hpp"

#include <chrono>
#include <cstdio>
#include <vector>

using probe::clock_type;
using probe::failures;
using probe::us_since;

int main() {
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CUcontext c;
  CK(cuDevicePrimaryCtxRetain(&c, d));
  CK(cuCtxSetCurrent(c));
  int version = 0;
  cuDriverGetVersion(&version);
  std::printf("driver API version %d\n", version);
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  std::size_t g = 0;
  CK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  std::printf("granularity %zu\n", g);
  CUmemAccessDesc a{};
  a.location = p.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  const std::size_t H = std::size_t{512} << 20;
  CUmemGenericAllocationHandle h;
  CK(cuMemCreate(&h, H, &p, 0));
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, H, 0, 0, 0));
  CK(cuMemMap(va, H, 0, h, 0));
  CK(cuMemSetAccess(va, H, &a, 1));
  CK(cuMemsetD8(va, 0, H));
  CK(cuMemsetD8(va + 100 * g, 7, g));

  // One granule of the handle, 100 granules in, at a second address.
  CUdeviceptr vb;
  CK(cuMemAddressReserve(&vb, 64 * g, 0, 0, 0));
  const int before = failures;
  CK(cuMemMap(vb, g, 100 * g, h, 0));
  if (failures == before) {
    CK(cuMemSetAccess(vb, g, &a, 1));
    unsigned char x = 0;
    CK(cuMemcpyDtoH(&x, vb, 1));
    std::printf("the part reads %d (want 7)\n", x);
    CK(cuMemUnmap(vb, g));
  }
  const bool parts = failures == before;
  std::printf("map at an offset: %s\n", parts ? "supported" : "NOT supported");

  // k parts of one handle, then k handles of one granule: map each, one set access.
  for (int k : {1, 4, 16, 64}) {
    std::vector<CUmemGenericAllocationHandle> hs(k);
    for (auto& x : hs) CK(cuMemCreate(&x, g, &p, 0));
    double best_parts = 0, best_handles = 1e18;
    for (int rep = 0; rep < 5; ++rep) {
      if (parts) {
        auto t = clock_type::now();
        for (int i = 0; i < k; ++i) CK(cuMemMap(vb + i * g, g, std::size_t(2 * i + 1) * g, h, 0));
        CK(cuMemSetAccess(vb, k * g, &a, 1));
        const double d1 = us_since(t);
        CK(cuMemUnmap(vb, k * g));
        if (best_parts == 0 || d1 < best_parts) best_parts = d1;
      }
      auto t = clock_type::now();
      for (int i = 0; i < k; ++i) CK(cuMemMap(vb + i * g, g, 0, hs[i], 0));
      CK(cuMemSetAccess(vb, k * g, &a, 1));
      const double d2 = us_since(t);
      CK(cuMemUnmap(vb, k * g));
      if (d2 < best_handles) best_handles = d2;
    }
    if (parts)
      std::printf("k %d: map + set access, parts of one handle %.1f us, separate handles %.1f us\n", k, best_parts,
                  best_handles);
    else
      std::printf("k %d: map + set access, separate handles %.1f us\n", k, best_handles);
    for (auto& x : hs) CK(cuMemRelease(x));
  }
  CK(cuMemAddressFree(vb, 64 * g));
  CK(cuMemUnmap(va, H));
  CK(cuMemAddressFree(va, H));
  CK(cuMemRelease(h));
  return parts ? 0 : 1;
}
