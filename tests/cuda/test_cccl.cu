// tests/cuda/test_cccl.cu - real CCCL code allocating through gmlake::cuda_resource
// on a GPU: CUB device algorithms' temporary storage and Thrust algorithms with a
// custom temporary allocator, every result checked against the host. The memory is
// fragmented first, so that requests are served by stitched blocks. Part of
// gmlake-cuda-tests (main.cpp skips it, exit 77, where no GPU can be used).
#include <gmlake/cuda_resource.hpp>  // first: it enables CCCL 3.0's cuda::mr concepts

#include <gmlake/backend/cuda_vmm.hpp>
#include <gmlake/gmlake.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "../conformance.hpp"

namespace {

using gmlake::backend::cuda_vmm;
using gpu_allocator = gmlake::basic_allocator<cuda_vmm>;
using gpu_resource = gmlake::cuda_resource<gpu_allocator>;

// What a library that takes "any device-accessible stream-ordered resource" holds.
#if CCCL_VERSION < 3001000
using device_ref = cuda::mr::async_resource_ref<cuda::mr::device_accessible>;
void* alloc_on(device_ref& r, std::size_t n, cudaStream_t s) { return r.allocate_async(n, 256, s); }
void free_on(device_ref& r, void* p, std::size_t n, cudaStream_t s) { r.deallocate_async(p, n, 256, s); }
#else
using device_ref = cuda::mr::resource_ref<cuda::mr::device_accessible>;
void* alloc_on(device_ref& r, std::size_t n, cudaStream_t s) { return r.allocate(s, n, 256); }
void free_on(device_ref& r, void* p, std::size_t n, cudaStream_t s) { r.deallocate(s, p, n, 256); }
#endif

std::size_t granularity() {
  static const std::size_t g = cuda_vmm(0, 1).granularity();
  return g;
}

struct stream {
  cudaStream_t s = nullptr;
  stream() { REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess); }
  ~stream() { cudaStreamDestroy(s); }
};

// Keys below 1000 keep every sum here (at most a few million keys) within 32 bits,
// whatever type CUB accumulates in.
std::vector<unsigned> random_keys(std::size_t n, unsigned seed, unsigned below) {
  std::mt19937 rng(seed);
  std::vector<unsigned> v(n);
  for (auto& x : v) x = rng() % below;
  return v;
}

void print_stats(const char* what, const gpu_allocator& a) {
  const gmlake::statistics s = a.stats();
  std::printf("  %s: %lld allocations through gmlake, peak requested %.1f MiB, peak reserved %.1f MiB; "
              "served S1 exact %llu, S2 split %llu, S3 stitched %llu, S4 shortfall %llu; cached stitch hits %llu\n",
              what, static_cast<long long>(s.allocations.allocated), s.requested_bytes.peak / 1048576.0,
              s.reserved_bytes.peak / 1048576.0, static_cast<unsigned long long>(s.fit[0]),
              static_cast<unsigned long long>(s.fit[1]), static_cast<unsigned long long>(s.fit[2]),
              static_cast<unsigned long long>(s.fit[3]), static_cast<unsigned long long>(s.cached_stitch_hits));
}

/// Eight chunk-sized blocks, every other one freed: four free chunks, none adjacent.
/// Returns the four kept (to free at the end).
std::vector<void*> fragment(device_ref& r, cudaStream_t s) {
  const std::size_t C = granularity();
  std::vector<void*> all, kept;
  for (int i = 0; i < 8; ++i) all.push_back(alloc_on(r, C, s));
  for (int i = 0; i < 8; ++i) {
    if (i % 2 == 0) free_on(r, all[i], C, s);
    else kept.push_back(all[i]);
  }
  return kept;
}

/// One CUB job on one stream: sort and sum `keys`, every buffer (temporary storage
/// included) from `r`. launch() queues it all and frees the temporary storage on the
/// stream at once (stream-ordered); check() waits and compares with the host.
struct cub_job {
  cub_job(device_ref& res, cudaStream_t on, std::vector<unsigned> k, const char* what)
      : r(&res), s(on), keys(std::move(k)), tag(what) {}

  device_ref* r;
  cudaStream_t s;
  std::vector<unsigned> keys;
  const char* tag;
  std::size_t n = 0, bytes = 0, sort_temp = 0, sum_temp = 0;
  unsigned* in = nullptr;
  unsigned* out = nullptr;
  unsigned long long* sum = nullptr;
  std::vector<unsigned> sorted;
  unsigned long long got_sum = 0;

  void launch() {
    n = keys.size();
    bytes = n * sizeof(unsigned);
    in = static_cast<unsigned*>(alloc_on(*r, bytes, s));
    out = static_cast<unsigned*>(alloc_on(*r, bytes, s));
    sum = static_cast<unsigned long long*>(alloc_on(*r, sizeof(unsigned long long), s));
    REQUIRE(cudaMemcpyAsync(in, keys.data(), bytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
    REQUIRE(cub::DeviceRadixSort::SortKeys(nullptr, sort_temp, in, out, static_cast<int>(n), 0, 32, s) == cudaSuccess);
    void* t = alloc_on(*r, sort_temp, s);
    REQUIRE(cub::DeviceRadixSort::SortKeys(t, sort_temp, in, out, static_cast<int>(n), 0, 32, s) == cudaSuccess);
    free_on(*r, t, sort_temp, s);  // reusable at once on s (after the sort), elsewhere once it is done
    REQUIRE(cub::DeviceReduce::Sum(nullptr, sum_temp, in, sum, static_cast<int>(n), s) == cudaSuccess);
    void* t2 = alloc_on(*r, sum_temp, s);
    REQUIRE(cub::DeviceReduce::Sum(t2, sum_temp, in, sum, static_cast<int>(n), s) == cudaSuccess);
    free_on(*r, t2, sum_temp, s);
    sorted.resize(n);
    REQUIRE(cudaMemcpyAsync(sorted.data(), out, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(&got_sum, sum, sizeof got_sum, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  }

  /// False, with a message, when a result differs from the host's.
  bool check() {
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    for (void* p : {static_cast<void*>(in), static_cast<void*>(out), static_cast<void*>(sum)}) free_on(*r, p, 0, s);
    std::vector<unsigned> want = keys;
    std::sort(want.begin(), want.end());
    const unsigned long long want_sum = std::accumulate(keys.begin(), keys.end(), 0ull);
    const bool ok = sorted == want && got_sum == want_sum;
    std::printf("  %s: %zu keys, sort temp %zu B, sum temp %zu B: sorted %s, sum %llu (want %llu) %s\n", tag, n,
                sort_temp, sum_temp, sorted == want ? "ok" : "WRONG", got_sum, want_sum, ok ? "ok" : "WRONG");
    return ok;
  }
};

bool cub_sort_and_sum(device_ref& r, std::vector<unsigned> keys, cudaStream_t s, const char* tag) {
  cub_job job(r, s, std::move(keys), tag);
  job.launch();
  return job.check();
}

/// Thrust's temporary allocator interface over a cuda::mr ref and one stream.
struct thrust_temporary_allocator {
  using value_type = char;
  device_ref* r;
  cudaStream_t s;
  std::size_t* calls;
  char* allocate(std::ptrdiff_t n) {
    ++*calls;
    return static_cast<char*>(alloc_on(*r, static_cast<std::size_t>(n), s));
  }
  void deallocate(char* p, std::size_t n) { free_on(*r, p, n, s); }
};

} // namespace

TEST_CASE("CCCL: CUB radix sort and reduce, temporary storage from gmlake through cuda::mr") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  std::printf("CCCL %d.%d.%d on %s (sm_%d%d), granularity %zu\n", CCCL_MAJOR_VERSION, CCCL_MINOR_VERSION,
              CCCL_PATCH_VERSION, prop.name, prop.major, prop.minor, granularity());
  gpu_allocator a(cuda_vmm(0, 64 * granularity()), gmlake_conformance::test_options());
  gpu_resource res(a);
  device_ref r(res);
  stream s;
  std::vector<void*> kept = fragment(r, s.s);

  // Sizes from 1 key to a few chunks: the larger ones need stitched blocks.
  bool ok = true;
  unsigned seed = 1;
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{100000}, std::size_t{1} << 20,
                        (std::size_t{3} << 20) + 12345, std::size_t{777777}}) {
    char tag[32];
    std::snprintf(tag, sizeof tag, "round %u", seed);
    ok = cub_sort_and_sum(r, random_keys(n, seed++, 1000), s.s, tag) && ok;
  }
  CHECK(ok);
  const gmlake::statistics st = a.stats();
  CHECK(st.fit[static_cast<std::size_t>(gmlake::fit_state::s3_stitch)] +
            st.fit[static_cast<std::size_t>(gmlake::fit_state::s4_shortfall)] > 0);
  print_stats("CUB", a);
  for (void* p : kept) free_on(r, p, granularity(), s.s);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  gmlake_test::check_released(a);
}

TEST_CASE("CCCL: CUB on two streams; a block freed on one is reused on the other only when safe") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  gpu_allocator a(cuda_vmm(0, 64 * granularity()), gmlake_conformance::test_options());
  gpu_resource res(a);
  device_ref r(res);
  stream s1, s2;
  // Both streams' jobs are queued before either is waited for: the second job
  // allocates while the first one's sort (whose temporary storage is already freed
  // on its stream) may still run. Every result must still match.
  bool ok = true;
  for (unsigned i = 0; i < 6; ++i) {
    cub_job x(r, i % 2 ? s1.s : s2.s, random_keys((std::size_t{2} << 20) + i * 4099, 100 + i, 1000), "stream A");
    cub_job y(r, i % 2 ? s2.s : s1.s, random_keys((std::size_t{1} << 20) + i * 8191, 200 + i, 1000), "stream B");
    x.launch();
    y.launch();
    ok = y.check() && ok;
    ok = x.check() && ok;
  }
  CHECK(ok);
  print_stats("two streams", a);
  gmlake_test::check_released(a);
}

TEST_CASE("CCCL: Thrust sort and reduce with a temporary allocator over cuda::mr") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  gpu_allocator a(cuda_vmm(0, 64 * granularity()), gmlake_conformance::test_options());
  gpu_resource res(a);
  device_ref r(res);
  stream s;
  std::vector<void*> kept = fragment(r, s.s);

  const std::size_t n = (std::size_t{3} << 20) + 7;
  const auto keys = random_keys(n, 42, 1u << 31);
  // The data buffer itself from the synchronous member (usable at once, on any stream).
  auto* d = static_cast<unsigned*>(res.allocate_sync(n * sizeof(unsigned), 256));
  REQUIRE(cudaMemcpy(d, keys.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice) == cudaSuccess);

  std::size_t calls = 0;
  thrust_temporary_allocator temp{&r, s.s, &calls};
  const thrust::device_ptr<unsigned> first(d);
  thrust::sort(thrust::cuda::par(temp).on(s.s), first, first + n);
  const unsigned long long sum =
      thrust::reduce(thrust::cuda::par(temp).on(s.s), first, first + n, 0ull, thrust::plus<unsigned long long>());
  std::vector<unsigned> sorted(n);
  REQUIRE(cudaMemcpyAsync(sorted.data(), d, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);

  std::vector<unsigned> want = keys;
  std::sort(want.begin(), want.end());
  const unsigned long long want_sum = std::accumulate(keys.begin(), keys.end(), 0ull);
  std::printf("  Thrust: %zu keys, %zu temporary allocations through gmlake: sorted %s, sum %llu (want %llu)\n", n,
              calls, sorted == want ? "ok" : "WRONG", sum, want_sum);
  CHECK(calls > 0);
  CHECK(sorted == want);
  CHECK(sum == want_sum);
  print_stats("Thrust", a);

  res.deallocate_sync(d, n * sizeof(unsigned), 256);
  for (void* p : kept) free_on(r, p, granularity(), s.s);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  gmlake_test::check_released(a);
}
