// gmlake/memory_resource.hpp - a gmlake allocator as a std::pmr::memory_resource.
//
// do_allocate throws out_of_memory (a std::bad_alloc) when the request cannot be
// served, backend_error on a driver failure, bad_alignment for an alignment that is not a power of two or is larger
// than the chunk size; do_deallocate throws nothing. Every call uses the stream
// given at construction.
#pragma once

#include <cstddef>
#include <memory_resource>
#include <utility>

#include "allocator.hpp"

namespace gmlake {

template <PhysicalBackend Backend, StitchPolicy Stitch = policy::best_fit_pieces,
          EvictionPolicy Evict = policy::lru, FitStrategy Fit = policy::best_fit>
class memory_resource : public std::pmr::memory_resource {
 public:
  using allocator_type = basic_allocator<Backend, Stitch, Evict, Fit>;
  using stream_type = typename Backend::stream_type;

  /// Owns an allocator built from `args` (as basic_allocator's constructor takes them).
  template <class... Args>
  explicit memory_resource(Args&&... args) : allocator_(std::forward<Args>(args)...) {}

  [[nodiscard]] allocator_type& allocator() noexcept { return allocator_; }
  [[nodiscard]] const allocator_type& allocator() const noexcept { return allocator_; }
  void set_stream(stream_type s) noexcept { stream_ = s; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    if (!std::has_single_bit(alignment) || alignment > allocator_.chunk_size()) throw bad_alignment(alignment);
    return allocator_.allocate(bytes, stream_, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) noexcept override {
    allocator_.deallocate(p, bytes, stream_);
  }
  /// Two resources are equal only if they are the same object: memory from one
  /// cannot be freed through another.
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }

  allocator_type allocator_;
  stream_type stream_{};
};

} // namespace gmlake
