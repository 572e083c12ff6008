// gmlake-gpu-replay: replays allocation traces on a real GPU through one allocator
// per process, streams honoured, and prints one JSON line per trace.
//
//   gmlake-gpu-replay --allocator gmlake|async|torch [--device N] [--settings KEY:VALUE,...] TRACE.trace.gz...
//
// Run one trace per process when comparing peaks: PyTorch's peak is not reset
// between traces (gmlake's and the pool's are).
//
//   gmlake  gmlake's default allocator on the CUDA VMM backend (--settings: with those
//           overrides of its rules, gmlake/settings.hpp; the rows are named gmlake:SETTINGS)
//   async   cudaMallocAsync / cudaFreeAsync on the device's default memory pool
//           (release threshold: never), as PyTorch's backend:cudaMallocAsync
//   torch   PyTorch's caching allocator through libtorch (c10 raw_alloc_with_stream /
//           raw_delete); PYTORCH_CUDA_ALLOC_CONF chooses its mode (expandable_segments:True)
//           and names the row torch-default or torch-expandable. Built only with libtorch.
//
// Each trace stream becomes a real CUDA stream (0: the legacy default stream), and
// each free goes to the stream the block was allocated on, as PyTorch does. Nothing
// runs on the streams: this measures the allocators alone.
//   peak_reserved_bytes   the allocator's own high-water mark of device memory held
//   device_peak_bytes     the device's view: max of (free at start - free now) over
//                         samples at every iteration marker and at the end
//   ns_per_op_after_4     wall time of the replay loop after the `i 4` marker, over the
//                         allocate and free calls it made (loop overhead included)
//   driver_us_per_iter_after_4   (gmlake) measured time inside driver calls per iteration
#include <gmlake/allocator.hpp>
#include <gmlake/backend/cuda_vmm.hpp>
#include <gmlake/configs.hpp>
#include <gmlake/settings.hpp>

#include "trace.hpp"

#include <cuda_runtime_api.h>

#ifdef GMLAKE_HAVE_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using gmlake_bench::event;
using gmlake_bench::trace;

/// Nanoseconds inside driver calls by kind: gmlake::call_names, then query and synchronize.
using driver_times = std::array<std::uint64_t, gmlake::call_count + 2>;

/// The CUDA backend with the time spent in each driver call added up.
class timed_vmm : public gmlake::backend::cuda_vmm {
 public:
  using base = gmlake::backend::cuda_vmm;
  using base::base;
  std::uint64_t calls = 0;  ///< driver calls made
  driver_times ns_of{};
  /// Time inside all driver calls.
  [[nodiscard]] std::uint64_t ns() const noexcept {
    std::uint64_t n = 0;
    for (std::uint64_t x : ns_of) n += x;
    return n;
  }

  template <class F>
  auto time(std::size_t kind, F f) noexcept {
    const auto t0 = clock_type::now();
    auto r = f();
    const auto d = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count());
    ns_of[kind] += d;
    ++calls;
    return r;
  }
  static constexpr std::size_t k(gmlake::call c) noexcept { return static_cast<std::size_t>(c); }
  static constexpr std::size_t query_kind = gmlake::call_count, synchronize_kind = gmlake::call_count + 1;

 public:

  [[nodiscard]] gmlake::result<std::uintptr_t> reserve(std::size_t n) noexcept { return time(k(gmlake::call::reserve), [&] { return base::reserve(n); }); }
  [[nodiscard]] gmlake::errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    return time(k(gmlake::call::address_free), [&] { return base::address_free(va, n); });
  }
  [[nodiscard]] gmlake::result<chunk_type> create(std::size_t n) noexcept { return time(k(gmlake::call::create), [&] { return base::create(n); }); }
  [[nodiscard]] gmlake::errc release(chunk_type c) noexcept { return time(k(gmlake::call::release), [&] { return base::release(c); }); }
  [[nodiscard]] gmlake::errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept {
    return time(k(gmlake::call::map), [&] { return base::map(va, n, c); });
  }
  [[nodiscard]] gmlake::errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    return time(k(gmlake::call::set_access), [&] { return base::set_access(va, n); });
  }
  [[nodiscard]] gmlake::errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    return time(k(gmlake::call::unmap), [&] { return base::unmap(va, n); });
  }
  [[nodiscard]] gmlake::result<event_type> record(stream_type s) noexcept { return time(k(gmlake::call::record), [&] { return base::record(s); }); }
  [[nodiscard]] gmlake::result<bool> query(event_type e) noexcept { return time(query_kind, [&] { return base::query(e); }); }
  [[nodiscard]] gmlake::errc synchronize(event_type e) noexcept { return time(synchronize_kind, [&] { return base::synchronize(e); }); }

};
static_assert(gmlake::PhysicalBackend<timed_vmm>);

/// One allocator behind a uniform face.
struct peer {
  virtual ~peer() = default;
  virtual const char* name() const = 0;
  virtual void* allocate(std::size_t n, cudaStream_t s) = 0;
  virtual void free(void* p, std::size_t n, cudaStream_t s) = 0;
  virtual std::uint64_t peak_reserved() = 0;
  virtual std::uint64_t driver_ns() { return 0; }
  virtual std::uint64_t driver_calls() { return 0; }
  /// Driver time by call kind (timed_vmm::ns_of; empty for the peers).
  virtual driver_times driver_ns_of() { return {}; }
  /// Backend calls that failed, by kind (gmlake only).
  virtual std::array<std::uint64_t, gmlake::call_count> stats_failures() { return {}; }
  virtual std::uint64_t device_allocs() { return 0; }  ///< segments / chunks made so far
  virtual void release() {}                            ///< give cached memory back (end of a trace)
};

struct gmlake_peer final : peer {
  gmlake::allocator<timed_vmm> a;
  std::string label;  ///< "gmlake", or "gmlake:" and the settings
  gmlake_peer(int device, const gmlake::settings& s)
      : a(timed_vmm(device), s.applied(gmlake::options{}), s.applied(gmlake::policy::best_fit_pieces{})),
        label(s.str().empty() ? "gmlake" : "gmlake:" + s.str()) {}
  const char* name() const override { return label.c_str(); }
  void* allocate(std::size_t n, cudaStream_t s) override { return a.try_allocate(n, reinterpret_cast<CUstream>(s)); }
  void free(void* p, std::size_t n, cudaStream_t s) override { a.deallocate(p, n, reinterpret_cast<CUstream>(s)); }
  std::uint64_t peak_reserved() override { return static_cast<std::uint64_t>(a.stats().reserved_bytes.peak); }
  std::uint64_t driver_ns() override { return a.backend().ns(); }
  std::uint64_t driver_calls() override { return a.backend().calls; }
  driver_times driver_ns_of() override { return a.backend().ns_of; }
  std::array<std::uint64_t, gmlake::call_count> stats_failures() override { return a.stats().call_failures; }
  std::uint64_t device_allocs() override {
    return a.stats().calls[static_cast<std::size_t>(gmlake::call::create)];
  }
  void release() override {
    (void)a.release_cached();
    a.reset_peaks();
  }
};

struct async_peer final : peer {
  cudaMemPool_t pool{};
  explicit async_peer(int device) {
    if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) throw std::runtime_error("no default pool");
    std::uint64_t never = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &never);
  }
  const char* name() const override { return "cudaMallocAsync"; }
  void* allocate(std::size_t n, cudaStream_t s) override {
    void* p = nullptr;
    return cudaMallocAsync(&p, n, s) == cudaSuccess ? p : nullptr;
  }
  void free(void* p, std::size_t, cudaStream_t s) override { cudaFreeAsync(p, s); }
  std::uint64_t peak_reserved() override {
    std::uint64_t v = 0;
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &v);
    return v;
  }
  void release() override {
    cudaDeviceSynchronize();
    cudaMemPoolTrimTo(pool, 0);
    std::uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
  }
};

#ifdef GMLAKE_HAVE_TORCH
struct torch_peer final : peer {
  int device;
  std::string label;
  explicit torch_peer(int d) : device(d) {
    int n = 0;
    cudaGetDeviceCount(&n);
    c10::cuda::CUDACachingAllocator::get()->init(n);
    const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    label = conf && std::strstr(conf, "expandable_segments:True") ? "torch-expandable" : "torch-default";
  }
  const char* name() const override { return label.c_str(); }
  void* allocate(std::size_t n, cudaStream_t s) override {
    try {
      return c10::cuda::CUDACachingAllocator::get()->raw_alloc_with_stream(n, s);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  void free(void* p, std::size_t, cudaStream_t) override { c10::cuda::CUDACachingAllocator::get()->raw_delete(p); }
  std::uint64_t peak_reserved() override {
    const auto st = c10::cuda::CUDACachingAllocator::get()->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    return static_cast<std::uint64_t>(st.reserved_bytes[0].peak);  // [0]: StatType::AGGREGATE
  }
  std::uint64_t device_allocs() override {
    const auto st = c10::cuda::CUDACachingAllocator::get()->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    return static_cast<std::uint64_t>(st.num_device_alloc);
  }
  // No release(): run one trace per process for PyTorch (its peak is per process).
};
#endif

std::size_t device_used(std::size_t free0) {
  std::size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  return free0 > free ? free0 - free : 0;
}

int replay(peer& a, const trace& t, int device) {
  (void)device;
  std::map<std::uintptr_t, cudaStream_t> streams;
  for (const event& e : t.events) {
    if (e.kind != event::alloc || streams.count(e.stream)) continue;
    cudaStream_t s = nullptr;
    if (e.stream != 0 && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
    streams[e.stream] = s;
  }
  std::vector<void*> ptrs(t.ids, nullptr);
  std::vector<std::uint64_t> sizes(t.ids, 0);
  std::vector<cudaStream_t> on(t.ids, nullptr);
  cudaDeviceSynchronize();
  std::size_t free0 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  std::uint64_t live = 0, peak_live = 0, failed = 0, ops_after = 0, iters_after = 0;
  std::uint64_t device_peak = 0;
  std::uint64_t drv_ns4 = 0, drv_calls4 = 0, allocs4 = 0;
  driver_times drv_of4{};
  bool seen4 = false;
  clock_type::time_point t4{};
  clock_type::duration measured{};
  for (const event& e : t.events) {
    switch (e.kind) {
      case event::alloc: {
        void* p = a.allocate(e.bytes, streams[e.stream]);
        if (seen4) ++ops_after;
        if (p == nullptr) {
          ++failed;
          break;
        }
        ptrs[e.id] = p;
        on[e.id] = streams[e.stream];
        sizes[e.id] = (e.bytes + 511) / 512 * 512;
        live += sizes[e.id];
        if (live > peak_live) peak_live = live;
        break;
      }
      case event::free:
        if (ptrs[e.id] != nullptr) {
          a.free(ptrs[e.id], 0, on[e.id]);
          if (seen4) ++ops_after;
          live -= sizes[e.id];
          ptrs[e.id] = nullptr;
        }
        break;
      case event::iter: {
        // Outside the timed stretch: sample the device's view of memory in use.
        const auto pause = clock_type::now();
        if (e.id >= 4 && seen4) ++iters_after;
        const std::uint64_t used = device_used(free0);
        if (used > device_peak) device_peak = used;
        if (e.id == 4 && !seen4) {
          seen4 = true;
          drv_ns4 = a.driver_ns();
          drv_calls4 = a.driver_calls();
          drv_of4 = a.driver_ns_of();
          allocs4 = a.device_allocs();
          t4 = clock_type::now();
        } else if (seen4) {
          measured += pause - t4;
          t4 = clock_type::now();
        }
        break;
      }
    }
  }
  if (seen4) measured += clock_type::now() - t4;
  if (seen4) ++iters_after;  // the last iteration has no closing marker
  const std::uint64_t used = device_used(free0);
  if (used > device_peak) device_peak = used;
  const double ns_per_op = ops_after ? std::chrono::duration<double, std::nano>(measured).count() / ops_after : 0;
  const double drv_us = iters_after ? (a.driver_ns() - drv_ns4) / 1e3 / static_cast<double>(iters_after) : 0;
  std::printf("{\"trace\":\"%s\",\"allocator\":\"%s\",\"allocs\":%zu,\"failed\":%llu,\"peak_live_bytes\":%llu,"
              "\"peak_reserved_bytes\":%llu,\"device_peak_bytes\":%llu,\"fragmentation\":%.6f,"
              "\"ns_per_op_after_4\":%.1f,\"ops_after_4\":%llu,\"iters_after_4\":%llu,"
              "\"driver_us_per_iter_after_4\":%.1f,\"driver_calls_after_4\":%llu,\"device_allocs_after_4\":%llu}\n",
              t.name.c_str(), a.name(), t.allocs, (unsigned long long)failed, (unsigned long long)peak_live,
              (unsigned long long)a.peak_reserved(), (unsigned long long)device_peak,
              a.peak_reserved() ? 1.0 - static_cast<double>(peak_live) / static_cast<double>(a.peak_reserved()) : 0.0,
              ns_per_op, (unsigned long long)ops_after, (unsigned long long)iters_after, drv_us,
              (unsigned long long)(a.driver_calls() - drv_calls4),
              (unsigned long long)(a.device_allocs() - allocs4));
  std::fflush(stdout);
  if (a.driver_ns() != 0) {  // where the driver time went, on stderr (replay.err)
    const auto of = a.driver_ns_of();
    std::fprintf(stderr, "%s %s driver us/iter after i 4 by call:", t.name.c_str(), a.name());
    for (std::size_t i = 0; i < of.size(); ++i) {
      const char* n = i < gmlake::call_count ? gmlake::call_names[i] : (i == gmlake::call_count ? "query" : "synchronize");
      std::fprintf(stderr, " %s %.1f", n, iters_after ? (of[i] - drv_of4[i]) / 1e3 / static_cast<double>(iters_after) : 0.0);
    }
    const auto st = a.stats_failures();
    std::fprintf(stderr, "; failed calls:");
    for (std::size_t i = 0; i < st.size(); ++i)
      if (st[i] != 0) std::fprintf(stderr, " %s %llu", gmlake::call_names[i], (unsigned long long)st[i]);
    std::fprintf(stderr, "\n");
  }
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    if (ptrs[i]) a.free(ptrs[i], 0, on[i]);
  a.release();
  for (auto& [k, s] : streams)
    if (s) cudaStreamDestroy(s);
  return failed ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  std::string which = "gmlake";
  int device = 0;
  std::string settings_text;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--allocator" && i + 1 < argc) which = argv[++i];
    else if (a == "--device" && i + 1 < argc) device = std::atoi(argv[++i]);
    else if (a == "--settings" && i + 1 < argc) (settings_text += ',') += argv[++i];
    else if (a == "-h" || a == "--help") {
      std::puts("usage: gmlake-gpu-replay --allocator gmlake|async|torch [--device N] [--settings KEY:VALUE,...]\n"
                "                         TRACE.trace.gz...\n"
                "--settings: gmlake's rules overridden (gmlake/settings.hpp); the rows are named gmlake:SETTINGS");
      return 0;
    } else files.push_back(a);
  }
  if (files.empty()) {
    std::fputs("gmlake-gpu-replay: no trace given (try --help)\n", stderr);
    return 2;
  }
  if (!settings_text.empty() && which != "gmlake") {
    std::fputs("gmlake-gpu-replay: --settings applies to --allocator gmlake only\n", stderr);
    return 2;
  }
  gmlake::settings settings;
  try {
    settings = gmlake::parse_settings(settings_text);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gmlake-gpu-replay: %s\n", e.what());
    return 2;
  }
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "gmlake-gpu-replay: no usable CUDA device %d\n", device);
    return 77;
  }
  std::unique_ptr<peer> a;
  try {
    if (which == "gmlake") a = std::make_unique<gmlake_peer>(device, settings);
    else if (which == "async") a = std::make_unique<async_peer>(device);
#ifdef GMLAKE_HAVE_TORCH
    else if (which == "torch") a = std::make_unique<torch_peer>(device);
#endif
    else {
      std::fprintf(stderr, "gmlake-gpu-replay: unknown or unbuilt allocator %s\n", which.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gmlake-gpu-replay: %s\n", e.what());
    return 1;
  }
  int rc = 0;
  for (const auto& f : files) {
    trace t;
    if (!gmlake_bench::load(f, t)) {
      std::fprintf(stderr, "gmlake-gpu-replay: cannot read trace %s\n", f.c_str());
      rc = 1;
      continue;
    }
    rc |= replay(*a, t, device);
  }
  return rc;
}
