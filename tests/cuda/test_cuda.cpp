// tests/cuda/test_cuda.cpp - the CUDA VMM backend on a real GPU: the conformance
// suite, kernels through stitched blocks, stream order against running kernels,
// real device OOM, driver errors. main.cpp skips all of it (exit 77) without a GPU.
#include <gmlake/backend/cuda_vmm.hpp>
#include <gmlake/gmlake.hpp>

#include "../conformance.hpp"
#include "kernels.hpp"

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using gmlake::backend::cuda_vmm;
using namespace gmlake_conformance;

std::size_t device_granularity() {
  static const std::size_t g = cuda_vmm(0, 1).granularity();
  return g;
}

/// Conformance on the GPU: 64 chunks of the device's granularity.
template <class Alloc>
struct cuda_combo {
  using alloc_type = Alloc;
  static constexpr bool real = true;
  static std::unique_ptr<Alloc> make() {
    return std::make_unique<Alloc>(cuda_vmm(0, capacity()), test_options());
  }
  static std::size_t granularity() { return device_granularity(); }
  static std::size_t capacity() { return 64 * device_granularity(); }
  static void write(void* dst, const void* src, std::size_t n) {
    REQUIRE(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  static void read(void* dst, const void* src, std::size_t n) {
    REQUIRE(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
};

std::size_t free_device_bytes() {
  std::size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return free;
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

struct stream_pair {
  cudaStream_t a = nullptr, b = nullptr;
  stream_pair() {
    REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~stream_pair() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
};

CUstream cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }

/// Do n device bytes at `at` and at `part` (two mappings) read the same?
bool same(const void* at, const void* part, std::size_t n) {
  std::vector<unsigned char> x(n), y(n);
  REQUIRE(cudaMemcpy(x.data(), at, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(y.data(), part, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  return x == y;
}

std::uint64_t calls(const gmlake::statistics& st, gmlake::call c) { return st.calls[static_cast<std::size_t>(c)]; }

/// Four chunks in a row (and a `spare` fifth if asked); the 1st and 3rd freed: two
/// free chunks apart.
template <class A>
struct two_apart {
  void *x1, *y1, *x2, *y2, *spare = nullptr;
  two_apart(A& a, std::size_t C, bool with_spare = false)
      : x1(a.allocate(C)), y1(a.allocate(C)), x2(a.allocate(C)), y2(a.allocate(C)) {
    if (with_spare) spare = a.allocate(C);
    a.deallocate(x1, C);
    a.deallocate(x2, C);
  }
};

} // namespace

TEST_CASE_TEMPLATE("cuda conformance", T, cuda_combo<gmlake::gmlake_allocator<cuda_vmm>>,
                   cuda_combo<gmlake::bfc_allocator<cuda_vmm>>, cuda_combo<gmlake::expandable_allocator<cuda_vmm>>,
                   cuda_combo<gmlake::gmlake_paper_allocator<cuda_vmm>>) {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  run_conformance<T>();
}

TEST_CASE("cuda backend: granularity, sizes, limit") {
  cuda_vmm b(0);
  CHECK(b.granularity() >= std::size_t{64} << 10);
  CHECK((b.granularity() & (b.granularity() - 1)) == 0);
  std::size_t free = 0, total = 0;
  REQUIRE(b.memory_info(free, total) == gmlake::errc::ok);
  CHECK(b.capacity() == gmlake::round_up(total, b.granularity()));
  std::printf("device 0: granularity %zu, capacity %zu, free %zu\n", b.granularity(), b.capacity(), free);
  b.set_limit(2 * b.granularity());
  auto c1 = b.create(b.granularity());
  auto c2 = b.create(b.granularity());
  REQUIRE(c1);
  REQUIRE(c2);
  CHECK(b.create(b.granularity()).error == gmlake::errc::out_of_memory);  // the limit, not a driver error
  CHECK(b.failure() == nullptr);
  CHECK(b.release(c1.value) == gmlake::errc::ok);
  CHECK(b.release(c2.value) == gmlake::errc::ok);
  CHECK(b.created_bytes() == 0);
  // A bad size is caught before the driver; mapping over a mapping is a driver error,
  // reported with the call and the driver's message. (A handle that does not exist
  // is not safe to pass: the driver may crash on it.)
  CHECK(b.create(b.granularity() + 1).error == gmlake::errc::invalid);
  b.clear_failure();
  auto va = b.reserve(2 * b.granularity());
  REQUIRE(va);
  auto c = b.create(b.granularity());
  REQUIRE(c);
  REQUIRE(b.map(va.value, b.granularity(), c.value) == gmlake::errc::ok);
  CHECK(b.failure() == nullptr);
  CHECK(b.map(va.value, b.granularity(), c.value) == gmlake::errc::driver);
  REQUIRE(b.failure() != nullptr);
  CHECK(std::string(b.failure()).find("cuMemMap") != std::string::npos);
  std::printf("driver error as reported: %s\n", b.failure());
  CHECK(b.unmap(va.value, b.granularity()) == gmlake::errc::ok);
  CHECK(b.release(c.value) == gmlake::errc::ok);
  CHECK(b.address_free(va.value, 2 * b.granularity()) == gmlake::errc::ok);
}

TEST_CASE("cuda backend: a device that does not exist is a backend_error with the reason") {
  bool thrown = false;
  try {
    cuda_vmm b(cuda_vmm::device_count() + 7);
  } catch (const gmlake::backend_error& e) {
    thrown = true;
    std::printf("as expected: %s\n", e.what());
    CHECK(std::string(e.what()).find("cuDeviceGet") != std::string::npos);
  }
  CHECK(thrown);
}

TEST_CASE("a kernel writes through a stitched block; every chunk holds its part") {
  const std::size_t C = device_granularity();
  gmlake::allocator<cuda_vmm> a(cuda_vmm(0, 64 * C), test_options());
  const two_apart t(a, C);
  void *x1 = t.x1, *y1 = t.y1, *x2 = t.x2, *y2 = t.y2;
  const auto before = a.stats();
  void* s = a.allocate(2 * C);
  const auto after = a.stats();
  CHECK(after.fit[2] == before.fit[2] + 1);  // S3: stitched, no new memory
  CHECK(after.reserved_bytes.current == before.reserved_bytes.current);
  CHECK(after.stitched_blocks.current == 1);
  REQUIRE(gmlake_gpu::fill(s, 2 * C, 42, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(s, 2 * C, 42, nullptr) == 0);
  // Each half of the stitch is one of the two chunks, read through the chunk's own mapping.
  std::vector<unsigned char> half0(C), half1(C), c1(C), c2(C);
  REQUIRE(cudaMemcpy(half0.data(), s, C, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(half1.data(), static_cast<char*>(s) + C, C, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(c1.data(), x1, C, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(c2.data(), x2, C, cudaMemcpyDeviceToHost) == cudaSuccess);
  const bool in_order = half0 == c1 && half1 == c2;
  const bool swapped = half0 == c2 && half1 == c1;
  CHECK((in_order || swapped));
  // And a kernel writing through a chunk is seen through the stitch.
  void* first = in_order ? x1 : x2;
  REQUIRE(gmlake_gpu::fill(first, C, 7, nullptr) == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(s, C, 7, nullptr) == 0);
  a.deallocate(s, 2 * C);
  // The cached stitch serves the same request again with no driver call.
  const auto calls = a.stats().calls;
  void* again = a.allocate(2 * C);
  CHECK(again == s);
  CHECK(a.stats().calls == calls);
  a.deallocate(again, 2 * C);
  a.deallocate(y1, C);
  a.deallocate(y2, C);
  gmlake_test::check_released(a);
}

TEST_CASE("a cached stitched block with a taken chunk is repaired: a kernel writes through it") {
  const std::size_t C = device_granularity();
  gmlake::allocator<cuda_vmm> a(cuda_vmm(0, 64 * C), test_options());
  const two_apart t(a, C, true);
  void *x1 = t.x1, *x2 = t.x2, *spare = t.spare;
  void* s = a.allocate(2 * C);  // x1 and x2 stitched
  a.deallocate(s, 2 * C);       // cached
  void* taken = a.allocate(C);  // one of them again: the block cannot be claimed whole
  CHECK((taken == x1 || taken == x2));
  REQUIRE(gmlake_gpu::fill(taken, C, 5, nullptr) == cudaSuccess);
  a.deallocate(spare, C);       // a free chunk of the same bytes elsewhere
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the work before the block's free is done
  const auto before = a.stats();
  void* again = a.allocate(2 * C);
  const auto after = a.stats();
  CHECK(again == s);
  CHECK(after.cached_stitch_repairs == before.cached_stitch_repairs + 1);
  CHECK(calls(after, gmlake::call::unmap) == calls(before, gmlake::call::unmap) + 1);
  CHECK(calls(after, gmlake::call::map) == calls(before, gmlake::call::map) + 1);
  CHECK(calls(after, gmlake::call::reserve) == calls(before, gmlake::call::reserve));
  CHECK(after.reserved_bytes.current == before.reserved_bytes.current);
  REQUIRE(gmlake_gpu::fill(again, 2 * C, 43, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(again, 2 * C, 43, nullptr) == 0);
  CHECK(gmlake_gpu::mismatches(taken, C, 5, nullptr) == 0);  // the taken chunk is untouched
  // One half of the block is the spare's chunk, read through the chunk's own mapping.
  std::vector<unsigned char> half0(C), half1(C), sp(C);
  REQUIRE(cudaMemcpy(half0.data(), again, C, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(half1.data(), static_cast<char*>(again) + C, C, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(sp.data(), spare, C, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK((half0 == sp || half1 == sp));
  a.deallocate(again, 2 * C);
  a.deallocate(taken, C);
  a.deallocate(t.y1, C);
  a.deallocate(t.y2, C);
  gmlake_test::check_released(a);
}

TEST_CASE("append: a kernel writes through a cached stitched block with a chunk appended") {
  const std::size_t C = device_granularity();
  gmlake::allocator<cuda_vmm> a(cuda_vmm(0, 64 * C), test_options());
  const two_apart t(a, C, true);
  void *x1 = t.x1, *x2 = t.x2, *spare = t.spare;
  void* s = a.allocate(2 * C);  // x1 and x2 stitched
  REQUIRE(gmlake_gpu::fill(s, 2 * C, 6, nullptr) == cudaSuccess);
  a.deallocate(s, 2 * C);       // cached
  a.deallocate(spare, C);       // a free chunk elsewhere
  REQUIRE(gmlake_gpu::fill(t.y1, C, 7, nullptr) == cudaSuccess);
  const auto before = a.stats();
  void* more = a.allocate(3 * C);  // the cached block with the spare's chunk after it
  const auto after = a.stats();
  CHECK(more == s);
  CHECK(after.cached_stitch_appends == before.cached_stitch_appends + 1);
  CHECK(calls(after, gmlake::call::map) == calls(before, gmlake::call::map) + 1);
  CHECK(calls(after, gmlake::call::set_access) == calls(before, gmlake::call::set_access) + 1);
  CHECK(calls(after, gmlake::call::reserve) == calls(before, gmlake::call::reserve));
  CHECK(after.reserved_bytes.current == before.reserved_bytes.current);
  REQUIRE(gmlake_gpu::fill(more, 3 * C, 45, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(more, 3 * C, 45, nullptr) == 0);
  CHECK(gmlake_gpu::mismatches(t.y1, C, 7, nullptr) == 0);  // its neighbours untouched
  // Its three parts, read through the chunks' own mappings: x1 and x2 (in the
  // planner's order), then the spare.
  auto* b = static_cast<const char*>(more);
  CHECK(((same(x1, b, C) && same(x2, b + C, C)) || (same(x2, b, C) && same(x1, b + C, C))));
  CHECK(same(spare, b + 2 * C, C));
  CHECK(a.check_invariants());
  a.deallocate(more, 3 * C);
  a.deallocate(t.y1, C);
  a.deallocate(t.y2, C);
  gmlake_test::check_released(a);
}

TEST_CASE("stitch edges: a kernel writes through a block that opens and closes inside partly used chunks") {
  // Chunks of 4 granules: H1 = [used | free 2C], H2 used, H3 free, H4 used,
  // H5 = [free 2C | used]. An 8C request is H1's free end, H3 and H5's free start.
  const std::size_t C = device_granularity();
  gmlake::policy::best_fit_pieces p;
  p.grow.max_chunk = 4 * C;
  p.grow.floor = p.grow.floor_divisor = 0;
  p.edges = 2 * C;  // 4 MiB, the default, at the H200's 2 MiB granularity
  gmlake::gmlake_allocator<cuda_vmm> a(cuda_vmm(0, 64 * C), test_options(), p);
  void* h[5];
  for (void*& x : h) x = a.allocate(4 * C);
  a.deallocate(h[4], 4 * C);
  void* filler = a.allocate(2 * C);
  void* y5 = a.allocate(2 * C);
  a.deallocate(h[0], 4 * C);
  void* x1 = a.allocate(2 * C);
  REQUIRE(x1 == h[0]);
  REQUIRE(filler == h[4]);
  a.deallocate(filler, 2 * C);
  a.deallocate(h[2], 4 * C);
  REQUIRE(gmlake_gpu::fill(x1, 2 * C, 3, nullptr) == cudaSuccess);
  REQUIRE(gmlake_gpu::fill(y5, 2 * C, 4, nullptr) == cudaSuccess);
  const auto before = a.stats();
  void* s = a.allocate(8 * C);
  const auto after = a.stats();
  REQUIRE(s != nullptr);
  CHECK(after.fit[2] == before.fit[2] + 1);  // S3: stitched, no new memory
  CHECK(after.reserved_bytes.current == before.reserved_bytes.current);
  REQUIRE(gmlake_gpu::fill(s, 8 * C, 44, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(s, 8 * C, 44, nullptr) == 0);
  // Its three parts, read through the chunks' own mappings: H1's free end, H3, H5's free start.
  auto* b = static_cast<const char*>(s);
  CHECK(same(static_cast<char*>(h[0]) + 2 * C, b, 2 * C));
  CHECK(same(h[2], b + 2 * C, 4 * C));
  CHECK(same(h[4], b + 6 * C, 2 * C));
  // The used halves of H1 and H5 are untouched.
  CHECK(gmlake_gpu::mismatches(x1, 2 * C, 3, nullptr) == 0);
  CHECK(gmlake_gpu::mismatches(y5, 2 * C, 4, nullptr) == 0);
  CHECK(a.check_invariants());
  a.deallocate(s, 8 * C);
  for (void* x : {x1, y5}) a.deallocate(x, 2 * C);
  for (void* x : {h[1], h[3]}) a.deallocate(x, 4 * C);
  gmlake_test::check_released(a);
}

TEST_CASE("stream order: memory freed under a running kernel is not handed to another stream") {
  const std::size_t C = device_granularity();
  stream_pair st;
  gmlake::allocator<cuda_vmm> a(cuda_vmm(0, 256 * C), test_options());
  const std::size_t n = 8 * C;
  constexpr std::uint64_t spin_ns = 300'000'000;  // 0.3 s: far longer than the host steps below

  SUBCASE("a plain block") {
    void* p = a.allocate(n, cu(st.a));
    REQUIRE(gmlake_gpu::spin_then_fill(p, n, 1, spin_ns, st.a) == cudaSuccess);
    a.deallocate(p, n, cu(st.a));
    CHECK(cudaStreamQuery(st.a) == cudaErrorNotReady);  // the kernel still runs
    void* q = a.allocate(n, cu(st.b));
    const bool still_running = cudaStreamQuery(st.a) == cudaErrorNotReady;
    if (still_running) CHECK_FALSE(overlaps(p, n, q, n));
    REQUIRE(gmlake_gpu::fill(q, n, 2, st.b) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(gmlake_gpu::mismatches(q, n, 2, st.b) == 0);
    if (!overlaps(p, n, q, n)) CHECK(gmlake_gpu::mismatches(p, n, 1, st.a) == 0);  // the kernel's writes landed
    // The same stream may reuse at once (stream order); another one once the work is done.
    a.deallocate(q, n, cu(st.b));
    const auto reserved = a.stats().reserved_bytes.current;
    void* r = a.allocate(n, cu(st.b));
    CHECK(a.stats().reserved_bytes.current == reserved);  // reused, nothing new
    a.deallocate(r, n, cu(st.b));
  }

  SUBCASE("a stitched block, and release_cached while its kernel runs") {
    void* x1 = a.allocate(4 * C, cu(st.a));
    void* y1 = a.allocate(C, cu(st.a));
    void* x2 = a.allocate(4 * C, cu(st.a));
    void* y2 = a.allocate(C, cu(st.a));
    a.deallocate(x1, 4 * C, cu(st.a));
    a.deallocate(x2, 4 * C, cu(st.a));
    void* s = a.allocate(n, cu(st.a));
    CHECK(a.stats().stitched_blocks.current == 1);
    REQUIRE(gmlake_gpu::spin_then_fill(s, n, 3, spin_ns, st.a) == cudaSuccess);
    a.deallocate(s, n, cu(st.a));
    // Stream b must get other physical memory than the stitch's chunks while the kernel runs.
    void* q = a.allocate(n, cu(st.b));
    if (cudaStreamQuery(st.a) == cudaErrorNotReady) {
      CHECK_FALSE(overlaps(x1, 4 * C, q, n));
      CHECK_FALSE(overlaps(x2, 4 * C, q, n));
    }
    a.deallocate(q, n, cu(st.b));
    REQUIRE(cudaStreamSynchronize(st.a) == cudaSuccess);
    CHECK(gmlake_gpu::mismatches(s, n, 3, st.a) == 0);  // the kernel wrote through the cached stitch
    // Hold the range q had, so the cached stitch is the only free block that fits: on
    // stream a it is reused at once. release_cached under its running kernel must wait
    // before unmapping it, or the kernel faults.
    void* q2 = a.allocate(n, cu(st.b));
    void* s2 = a.allocate(n, cu(st.a));
    CHECK(s2 == s);
    CHECK(a.stats().cached_stitch_hits >= 1);
    REQUIRE(gmlake_gpu::spin_then_fill(s2, n, 5, spin_ns, st.a) == cudaSuccess);
    a.deallocate(s2, n, cu(st.a));
    CHECK(cudaStreamQuery(st.a) == cudaErrorNotReady);
    (void)a.release_cached();
    CHECK(cudaStreamSynchronize(st.a) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(gmlake_gpu::mismatches(y1, C, 0, st.a) != SIZE_MAX);  // the context is healthy
    a.deallocate(y1, C, cu(st.a));
    a.deallocate(y2, C, cu(st.a));
    a.deallocate(q2, n, cu(st.b));
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  gmlake_test::check_released(a);
}

TEST_CASE("stream order: cudaStreamPerThread on two threads is two streams") {
  // One handle, a different stream on each thread: a block freed on thread 1's
  // per-thread stream under a running kernel is not thread 2's until that work is done.
  const std::size_t C = device_granularity();
  gmlake::allocator<cuda_vmm> a(cuda_vmm(0, 64 * C), test_options());
  const std::size_t n = 4 * C;
  constexpr std::uint64_t spin_ns = 300'000'000;
  const CUstream h = cu(cudaStreamPerThread);
  void* p = nullptr;
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  bool queued = false;
  std::thread t1([&] {
    if (cudaSetDevice(0) != cudaSuccess) return;
    p = a.allocate(n, h);
    queued = gmlake_gpu::spin_then_fill(p, n, 1, spin_ns, cudaStreamPerThread) == cudaSuccess &&
             cudaEventRecord(done, cudaStreamPerThread) == cudaSuccess;
    a.deallocate(p, n, h);
  });
  t1.join();  // its per-thread stream's kernel still runs
  REQUIRE(queued);
  void* q = a.allocate(n, h);  // this thread's per-thread stream
  const bool running = cudaEventQuery(done) == cudaErrorNotReady;  // (under memcheck it may be done)
  if (running) CHECK_FALSE(overlaps(p, n, q, n));
  REQUIRE(gmlake_gpu::fill(q, n, 2, cudaStreamPerThread) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(q, n, 2, cudaStreamPerThread) == 0);  // not overwritten by thread 1's kernel
  a.deallocate(q, n, h);
  void* r = a.allocate(n, h);  // thread 1's work is done now: its bytes may come here
  CHECK(r != nullptr);
  CHECK(a.check_invariants());
  a.deallocate(r, n, h);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaEventDestroy(done);
  gmlake_test::check_released(a);
}

TEST_CASE("stream order: a stream forgotten before it is destroyed") {
  // Its frees are usable on another stream at once, and nothing is recorded on the
  // destroyed handle (compute-sanitizer reports an event recorded on a dead stream).
  const std::size_t C = device_granularity();
  gmlake::allocator<cuda_vmm> a(cuda_vmm(0, 64 * C), test_options());
  const std::size_t n = 4 * C;
  cudaStream_t s1 = nullptr, s2 = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  void* fence = a.allocate(n, cu(s1));
  void* p = a.allocate(n, cu(s1));
  REQUIRE(gmlake_gpu::fill(p, n, 1, s1) == cudaSuccess);
  a.deallocate(p, n, cu(s1));
  a.deallocate(fence, n, cu(s1));
  REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
  a.forget_stream(cu(s1));
  REQUIRE(cudaStreamDestroy(s1) == cudaSuccess);
  void* q = a.allocate(n, cu(s2));
  void* r = a.allocate(n, cu(s2));
  CHECK((overlaps(p, n, q, n) || overlaps(p, n, r, n)));  // s1's bytes, without an event on s1
  REQUIRE(gmlake_gpu::fill(q, n, 2, s2) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(q, n, 2, s2) == 0);
  CHECK(a.check_invariants());
  a.deallocate(q, n, cu(s2));
  a.deallocate(r, n, cu(s2));
  REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
  gmlake_test::check_released(a);
  REQUIRE(cudaStreamDestroy(s2) == cudaSuccess);
}

TEST_CASE("real device OOM: nullptr / out_of_memory, state intact, every byte back") {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::size_t free0 = free_device_bytes();
  {
    gmlake::allocator<cuda_vmm> a{cuda_vmm(0)};
    const std::size_t block = std::size_t{1} << 30;
    std::vector<void*> live;
    while (void* p = a.try_allocate(block)) live.push_back(p);
    std::printf("device OOM after %zu x 1 GiB (free at start %.1f GiB)\n", live.size(),
                static_cast<double>(free0) / (1 << 30));
    CHECK(live.size() + 2 >= free0 / block);  // nearly all of the free memory was usable
    CHECK(a.check_invariants());
    CHECK(a.stats().num_ooms >= 1);
    CHECK_THROWS_AS((void)a.allocate(block), gmlake::out_of_memory);
    // Still serves what fits, and the data is intact.
    a.deallocate(live.back(), block);
    live.pop_back();
    void* small = a.allocate(4096);
    REQUIRE(!live.empty());
    REQUIRE(gmlake_gpu::fill(live.back(), block, 9, nullptr) == cudaSuccess);
    CHECK(gmlake_gpu::mismatches(live.back(), block, 9, nullptr) == 0);
    a.deallocate(small, 4096);
    for (void* p : live) a.deallocate(p, block);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    (void)a.release_cached();
    CHECK(a.stats().reserved_bytes.current == 0);
    const std::size_t free1 = free_device_bytes();
    std::printf("free after release_cached: %zu (start %zu)\n", free1, free0);
    CHECK(free1 + (std::size_t{2} << 20) >= free0);
  }
  const std::size_t free2 = free_device_bytes();
  std::printf("free after the allocator is gone: %zu (start %zu, diff %lld)\n", free2, free0,
              static_cast<long long>(free2) - static_cast<long long>(free0));
  CHECK(free2 + (std::size_t{2} << 20) >= free0);
}

TEST_CASE("std::pmr over the CUDA backend") {
  gmlake::allocator<cuda_vmm> a{cuda_vmm(0, 32 * device_granularity())};
  gmlake::memory_resource r(a);
  void* p = r.allocate(3 << 20, 256);
  REQUIRE(gmlake_gpu::fill(p, 3 << 20, 5, nullptr) == cudaSuccess);
  CHECK(gmlake_gpu::mismatches(p, 3 << 20, 5, nullptr) == 0);
  CHECK_THROWS_AS((void)r.allocate(std::size_t{1} << 40, 256), gmlake::out_of_memory);
  CHECK_THROWS_AS((void)r.allocate(64, 3), gmlake::bad_alignment);
  r.deallocate(p, 3 << 20, 256);
  gmlake_test::check_released(r.allocator());
}
