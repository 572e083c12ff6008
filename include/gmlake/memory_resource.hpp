// gmlake/memory_resource.hpp - a std::pmr::memory_resource view of a gmlake
// allocator, bound to one stream.
//
// What holds for all of it:
//  - a view does not own its allocator: it refers to one, which must outlive it and
//    every container using it. Views on several streams share one allocator, so one
//    pool: `memory_resource on0(a); auto on1 = on0.on(stream1);`;
//  - a view's stream is fixed when it is made; every allocation and free through it
//    is on that stream. There is nothing to set, so nothing to race on: another
//    stream is another view (copy assignment is deleted for that reason);
//  - two views compare equal (std::pmr's is_equal: memory from one may be freed
//    through the other) when they share the allocator and the stream;
//  - only allocators whose backend's memory can be touched are accepted
//    (BackendMemoryAccessible): containers write to what they get, so a view over
//    the simulated backend does not compile;
//  - do_allocate throws out_of_memory (a std::bad_alloc) when the request cannot be
//    served, backend_error on a driver failure, bad_alignment for an alignment that
//    is not a power of two or is larger than max_alignment(); do_deallocate throws
//    nothing.
#pragma once

#include <bit>
#include <cstddef>
#include <memory_resource>

#include "allocator_concept.hpp"
#include "concepts.hpp"
#include "errors.hpp"

namespace gmlake {

/// @brief A std::pmr::memory_resource over `Allocator` (basic_allocator or an
///        adaptor over one), on one stream.
template <StreamAllocator Allocator>
  requires BackendMemoryAccessible<typename Allocator::backend_type>
class memory_resource final : public std::pmr::memory_resource {
 public:
  using allocator_type = Allocator;
  using stream_type = typename Allocator::stream_type;

  /// @brief A view of `a` on `stream` (default: the default stream).
  explicit memory_resource(Allocator& a, stream_type stream = {}) noexcept : a_(&a), stream_(stream) {}
  memory_resource(const memory_resource& other) noexcept
      : std::pmr::memory_resource(), a_(other.a_), stream_(other.stream_) {}
  memory_resource& operator=(const memory_resource&) = delete;

  /// @brief Another view of the same allocator, on `stream`.
  [[nodiscard]] memory_resource on(stream_type stream) const noexcept { return memory_resource(*a_, stream); }

  [[nodiscard]] Allocator& allocator() const noexcept { return *a_; }
  [[nodiscard]] stream_type stream() const noexcept { return stream_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    if (!std::has_single_bit(alignment) || alignment > a_->max_alignment()) throw bad_alignment(alignment);
    return a_->allocate(bytes, stream_, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) noexcept override {
    a_->deallocate(p, bytes, stream_);
  }
  /// Equal: the same allocator and the same stream (any other view frees on its own stream).
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    if (this == &other) return true;
    const auto* o = dynamic_cast<const memory_resource*>(&other);
    return o != nullptr && o->a_ == a_ && o->stream_ == stream_;
  }

  Allocator* a_;
  stream_type stream_;
};

} // namespace gmlake
