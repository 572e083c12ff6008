// tests/cuda/test_mr_concepts.cu - gmlake::cuda_resource against CCCL's cuda::mr
// concepts (checked at compile time), and how each member maps onto the allocator
// (checked at run time on a stand-in allocator). No GPU needed: no CUDA call is made.
#include <gmlake/backend/cuda_vmm.hpp>
#include <gmlake/cuda_resource.hpp>
#include <gmlake/gmlake.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

using gpu_allocator = gmlake::basic_allocator<gmlake::backend::cuda_vmm>;
using gpu_resource = gmlake::cuda_resource<gpu_allocator>;

// The toolkit's CCCL (3.0 with CUDA 13.0) has the first shape; newer CCCL the second.
#if CCCL_VERSION < 3001000
static_assert(cuda::mr::resource<gpu_resource>);
static_assert(cuda::mr::async_resource<gpu_resource>);
static_assert(cuda::mr::resource_with<gpu_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<gpu_resource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::async_resource_with<gpu_resource, cuda::mr::host_accessible>);
using async_ref = cuda::mr::async_resource_ref<cuda::mr::device_accessible>;
#else
static_assert(cuda::mr::synchronous_resource<gpu_resource>);
static_assert(cuda::mr::resource<gpu_resource>);
static_assert(cuda::mr::synchronous_resource_with<gpu_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<gpu_resource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<gpu_resource, cuda::mr::host_accessible>);
using async_ref = cuda::mr::resource_ref<cuda::mr::device_accessible>;
#endif
static_assert(std::is_nothrow_copy_constructible_v<gpu_resource> && sizeof(gpu_resource) == sizeof(void*));

/// Records the calls it gets; hands out addresses from a counter.
struct stand_in_allocator {
  using stream_type = cudaStream_t;
  struct call {
    char kind;  // 'a' allocate, 'd' deallocate
    std::size_t bytes;
    cudaStream_t stream;
    std::size_t alignment;
  };
  std::vector<call> calls;
  std::uintptr_t next = 0x10000;

  void* allocate(std::size_t bytes, cudaStream_t s, std::size_t alignment) {
    calls.push_back({'a', bytes, s, alignment});
    next += 0x10000;
    return reinterpret_cast<void*>(next);
  }
  void deallocate(void*, std::size_t bytes, cudaStream_t s) noexcept { calls.push_back({'d', bytes, s, 0}); }
};

cudaStream_t fake_stream(std::uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }

} // namespace

TEST_CASE("cuda_resource: stream-ordered members pass bytes, alignment and the stream in order") {
  stand_in_allocator a;
  gmlake::cuda_resource<stand_in_allocator> r(a);
  const cudaStream_t s = fake_stream(0x1234);

  void* p = r.allocate(cuda::stream_ref(s), 1000, 4096);        // newer CCCL's shape
  void* q = r.allocate_async(2000, 256, cuda::stream_ref(s));    // CCCL 3.0's shape
  r.deallocate(cuda::stream_ref(s), p, 1000, 4096);
  r.deallocate_async(q, 2000, 256, cuda::stream_ref(s));
  REQUIRE(a.calls.size() == 4);
  CHECK((a.calls[0].kind == 'a' && a.calls[0].bytes == 1000 && a.calls[0].alignment == 4096 && a.calls[0].stream == s));
  CHECK((a.calls[1].kind == 'a' && a.calls[1].bytes == 2000 && a.calls[1].alignment == 256 && a.calls[1].stream == s));
  CHECK((a.calls[2].kind == 'd' && a.calls[2].bytes == 1000 && a.calls[2].stream == s));
  CHECK((a.calls[3].kind == 'd' && a.calls[3].bytes == 2000 && a.calls[3].stream == s));
}

TEST_CASE("cuda_resource: a type-erased cuda::mr ref reaches the allocator") {
  stand_in_allocator a;
  gmlake::cuda_resource<stand_in_allocator> r(a);
  async_ref ref(r);
  const cudaStream_t s = fake_stream(0x42);
#if CCCL_VERSION < 3001000
  void* p = ref.allocate_async(512, 128, cuda::stream_ref(s));
  ref.deallocate_async(p, 512, 128, cuda::stream_ref(s));
#else
  void* p = ref.allocate(cuda::stream_ref(s), 512, 128);
  ref.deallocate(cuda::stream_ref(s), p, 512, 128);
#endif
  REQUIRE(a.calls.size() == 2);
  CHECK((a.calls[0].bytes == 512 && a.calls[0].alignment == 128 && a.calls[0].stream == s));
  CHECK((a.calls[1].kind == 'd' && a.calls[1].stream == s));
}

TEST_CASE("cuda_resource: equal when over the same allocator") {
  stand_in_allocator a, b;
  gmlake::cuda_resource<stand_in_allocator> ra(a), ra2(a), rb(b);
  CHECK(ra == ra2);
  CHECK(ra != rb);
  CHECK(&ra.allocator() == &a);
}
