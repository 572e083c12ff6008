// gmlake/cuda_resource.hpp - a gmlake allocator on the CUDA backend as a CCCL
// `cuda::mr` memory resource (for cuda::mr resource refs, CUB and Thrust temporary
// storage, RMM, cudax).
//
// What holds for all of it:
//  - cuda_resource is non-owning: it holds a pointer to one allocator, which must
//    outlive it and every copy. Copies are cheap and compare equal when they point
//    to the same allocator (memory from one may be freed through the other);
//  - the stream is per call, through cuda::stream_ref; memory freed on a stream is
//    reused at once on that stream, on another only once that stream's work is done
//    (the allocator's stream order);
//  - it models both shapes of CCCL's resource concepts:
//      CCCL 3.0 (the CUDA 13.0 toolkit): resource and async_resource, i.e.
//        allocate(bytes, align), deallocate(p, bytes, align),
//        allocate_async(bytes, align, stream), deallocate_async(p, bytes, align, stream);
//      newer CCCL: synchronous_resource and resource, i.e.
//        allocate_sync(bytes, align), deallocate_sync(p, bytes, align),
//        allocate(stream, bytes, align), deallocate(stream, p, bytes, align);
//    and the property cuda::mr::device_accessible (not host_accessible);
//  - allocation throws gmlake::out_of_memory (a std::bad_alloc) or
//    gmlake::backend_error; deallocation throws nothing.
//
// CCCL 3.0 hides its resource concepts behind LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE:
// this header defines it when no CCCL memory-resource header has been included
// yet, and stops with a message when one was included without it.
#pragma once

#include <cuda/version>

#if CCCL_VERSION < 3001000 && !defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
#  if defined(_CUDA__MEMORY_RESOURCE_RESOURCE_H)
#    error "gmlake/cuda_resource.hpp: define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE before including <cuda/memory_resource> (or include this header first)"
#  endif
#  define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <cuda/memory_resource>
#include <cuda/stream_ref>
#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>

namespace gmlake {

/// What cuda_resource needs of an allocator: gmlake's allocator interface with
/// CUDA streams (basic_allocator<backend::cuda_vmm, ...>, or an adaptor over it).
template <class A>
concept CudaStreamAllocator = std::same_as<typename A::stream_type, cudaStream_t> &&
    requires(A& a, void* p, std::size_t n, cudaStream_t s) {
  { a.allocate(n, s, n) } -> std::same_as<void*>;
  { a.deallocate(p, n, s) } noexcept;
};

/// @brief A non-owning cuda::mr resource over a gmlake allocator on the CUDA backend.
template <CudaStreamAllocator Allocator>
class cuda_resource {
 public:
  using allocator_type = Allocator;

  /// @brief Refers to `a`, which must outlive this object and its copies.
  explicit cuda_resource(Allocator& a) noexcept : a_(&a) {}

  [[nodiscard]] Allocator& allocator() const noexcept { return *a_; }

  // ------------------------------------------------------------ stream-ordered

  /// @brief `bytes` for use on `stream`, aligned to `alignment` (a power of two, at
  ///        most the allocator's max_alignment(): by default the chunk size).
  /// @throws out_of_memory, backend_error.
  [[nodiscard]] void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment) {
    return a_->allocate(bytes, stream.get(), alignment);
  }
  /// @brief Frees p, last used on `stream`: reused on `stream` at once, elsewhere
  ///        once the work queued on `stream` before this call is done.
  void deallocate(cuda::stream_ref stream, void* p, std::size_t bytes, std::size_t /*alignment*/) noexcept {
    a_->deallocate(p, bytes, stream.get());
  }
  /// CCCL 3.0's names for the two above.
  [[nodiscard]] void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) {
    return allocate(stream, bytes, alignment);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept {
    deallocate(stream, p, bytes, alignment);
  }

  // ------------------------------------------------------------ synchronous

  /// @brief `bytes` usable at once on any stream and from the host's point of view:
  ///        allocated on the default stream, which is then synchronised (a block
  ///        freed on it may still be in use by work queued there).
  /// @throws out_of_memory, backend_error, cuda::cuda_error if the synchronisation fails
  ///         (the block is freed again first).
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
    void* p = a_->allocate(bytes, cudaStream_t{}, alignment);
    try {
      cuda::stream_ref(cudaStream_t{}).wait();
    } catch (...) {
      a_->deallocate(p, bytes, cudaStream_t{});
      throw;
    }
    return p;
  }
  /// @brief Frees p, whose work is done or queued on the default stream.
  void deallocate_sync(void* p, std::size_t bytes, std::size_t /*alignment*/) noexcept {
    a_->deallocate(p, bytes, cudaStream_t{});
  }
  /// CCCL 3.0's names for the two above.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) { return allocate_sync(bytes, alignment); }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { deallocate_sync(p, bytes, alignment); }

  // ------------------------------------------------------------ resource

  /// Same allocator: memory from one may be freed through the other.
  [[nodiscard]] friend bool operator==(const cuda_resource& x, const cuda_resource& y) noexcept {
    return x.a_ == y.a_;
  }
  [[nodiscard]] friend bool operator!=(const cuda_resource& x, const cuda_resource& y) noexcept {
    return !(x == y);
  }
  /// Device memory: accessible from kernels, not from the host.
  friend constexpr void get_property(const cuda_resource&, cuda::mr::device_accessible) noexcept {}

 private:
  Allocator* a_;
};

} // namespace gmlake
