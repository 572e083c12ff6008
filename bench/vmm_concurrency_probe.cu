// bench/vmm_concurrency_probe.cu - does cuMemSetAccess cost less from several threads,
// or on a handle that is mapped already?
//
// cuMemSetAccess costs about 25 us per handle on the H200 whether one call covers
// one handle or many (bench/results/h200-vmm-call-cost.txt), and it is most of
// gmlake's driver time after warm-up. This probe times, for N handles mapped side by
// side in one reservation:
//   - one call over all of them, and one call per handle;
//   - the same handles split over T threads (T = 2, 4, 8), each making one call over
//     its own contiguous part, wall time from the first thread's start to the last
//     one's end;
//   - the handles mapped a second time at another address (an alias, as a stitch
//     maps chunks that the arena maps already) and made accessible there;
//   - cuMemCreate and cuMemUnmap + cuMemRelease from T threads.
// Medians of `reps` rounds, microseconds, for 2 MiB and 32 MiB handles.
//
//   nvcc -O2 -std=c++20 -o vmm_concurrency_probe bench/vmm_concurrency_probe.cu -lcuda && ./vmm_concurrency_probe
//
// On the H200 (driver 580.159.04, bench/results/h200-vmm-concurrency.txt) the driver
// serializes these calls: 64 handles of 2 MiB took 28-33 us each by one call, a call
// each, or on an alias, and 32-36 / 38-43 / 49-56 us each from 2 / 4 / 8 threads;
// creates and unmap + release were slower from 4 threads too. gmlake therefore makes
// its driver calls from the requesting thread, one access call per run of handles.
#include <cuda.h>

#include "probe.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace {
using probe::clock_type;
using probe::failures;
using probe::us_since;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

CUcontext ctx;
CUmemAllocationProp prop{};
CUmemAccessDesc rw{};

/// Runs f(i) for i in [0, threads) on that many threads (the calling one among
/// them) and returns the wall time in us.
template <class F>
double on_threads(int threads, F f) {
  std::vector<std::thread> pool;
  const auto t = clock_type::now();
  for (int i = 1; i < threads; ++i)
    pool.emplace_back([&, i] {
      cuCtxSetCurrent(ctx);
      f(i);
    });
  f(0);
  for (auto& th : pool) th.join();
  return us_since(t);
}

struct handles {
  std::vector<CUmemGenericAllocationHandle> h;
  std::size_t bytes;
};

handles create(int n, std::size_t bytes) {
  handles s{std::vector<CUmemGenericAllocationHandle>(static_cast<std::size_t>(n)), bytes};
  for (auto& x : s.h) CK(cuMemCreate(&x, bytes, &prop, 0));
  return s;
}
void release(handles& s) {
  for (auto x : s.h) CK(cuMemRelease(x));
}
CUdeviceptr map_all(const handles& s) {
  CUdeviceptr va = 0;
  CK(cuMemAddressReserve(&va, s.h.size() * s.bytes, 0, 0, 0));
  for (std::size_t i = 0; i < s.h.size(); ++i) CK(cuMemMap(va + i * s.bytes, s.bytes, 0, s.h[i], 0));
  return va;
}
void unmap_all(const handles& s, CUdeviceptr va) {
  CK(cuMemUnmap(va, s.h.size() * s.bytes));
  CK(cuMemAddressFree(va, s.h.size() * s.bytes));
}
double set_access_threads(const handles& s, CUdeviceptr va, int threads) {
  const std::size_t n = s.h.size(), per = (n + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
  return on_threads(threads, [&](int i) {
    const std::size_t b = std::min(n, per * static_cast<std::size_t>(i)), e = std::min(n, b + per);
    if (e > b) CK(cuMemSetAccess(va + b * s.bytes, (e - b) * s.bytes, &rw, 1));
  });
}

void measure(int n, std::size_t bytes, int reps) {
  const double mib = static_cast<double>(bytes) / (1 << 20);
  std::vector<double> one, each, alias, t2, t4, t8, create1, create4, free1, free4;
  for (int r = 0; r < reps; ++r) {
    handles s = create(n, bytes);
    {  // one call over all
      CUdeviceptr va = map_all(s);
      auto t = clock_type::now();
      CK(cuMemSetAccess(va, s.h.size() * bytes, &rw, 1));
      one.push_back(us_since(t));
      // an alias of the same handles, as a stitch makes
      CUdeviceptr va2 = map_all(s);
      t = clock_type::now();
      CK(cuMemSetAccess(va2, s.h.size() * bytes, &rw, 1));
      alias.push_back(us_since(t));
      unmap_all(s, va2);
      unmap_all(s, va);
    }
    {  // one call per handle
      CUdeviceptr va = map_all(s);
      auto t = clock_type::now();
      for (std::size_t i = 0; i < s.h.size(); ++i) CK(cuMemSetAccess(va + i * bytes, bytes, &rw, 1));
      each.push_back(us_since(t));
      unmap_all(s, va);
    }
    for (int threads : {2, 4, 8}) {
      CUdeviceptr va = map_all(s);
      const double w = set_access_threads(s, va, threads);
      (threads == 2 ? t2 : threads == 4 ? t4 : t8).push_back(w);
      unmap_all(s, va);
    }
    release(s);
    // creates and releases, 1 and 4 threads
    for (int threads : {1, 4}) {
      handles c{std::vector<CUmemGenericAllocationHandle>(static_cast<std::size_t>(n)), bytes};
      const std::size_t per = (static_cast<std::size_t>(n) + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
      const double w = on_threads(threads, [&](int i) {
        for (std::size_t k = per * static_cast<std::size_t>(i); k < std::min(c.h.size(), per * static_cast<std::size_t>(i + 1)); ++k)
          CK(cuMemCreate(&c.h[k], bytes, &prop, 0));
      });
      (threads == 1 ? create1 : create4).push_back(w);
      CUdeviceptr va = map_all(c);
      CK(cuMemSetAccess(va, c.h.size() * bytes, &rw, 1));
      const double f = on_threads(threads, [&](int i) {
        for (std::size_t k = per * static_cast<std::size_t>(i); k < std::min(c.h.size(), per * static_cast<std::size_t>(i + 1)); ++k) {
          CK(cuMemUnmap(va + k * bytes, bytes));
          CK(cuMemRelease(c.h[k]));
        }
      });
      (threads == 1 ? free1 : free4).push_back(f);
      CK(cuMemAddressFree(va, c.h.size() * bytes));
    }
  }
  const double k = n;
  std::printf("%d x %.0f MiB handles, us per handle (median of %d): set_access one call %.1f, a call each %.1f, "
              "alias one call %.1f, 2 threads %.1f, 4 threads %.1f, 8 threads %.1f | create 1 thread %.1f, 4 threads %.1f | "
              "unmap+release 1 thread %.1f, 4 threads %.1f\n",
              n, mib, reps, median(one) / k, median(each) / k, median(alias) / k, median(t2) / k, median(t4) / k,
              median(t8) / k, median(create1) / k, median(create4) / k, median(free1) / k, median(free4) / k);
}
}  // namespace

int main() {
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, d));
  CK(cuCtxSetCurrent(ctx));
  int version = 0;
  cuDriverGetVersion(&version);
  std::printf("driver API version %d\n", version);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  rw.location = prop.location;
  rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  measure(8, std::size_t{2} << 20, 3);  // warm-up, not reported apart
  measure(64, std::size_t{2} << 20, 9);
  measure(16, std::size_t{32} << 20, 9);
  measure(4, std::size_t{256} << 20, 9);
  std::printf("%d failed calls\n", failures);
  return failures == 0 ? 0 : 1;
}
