// gmlake/allocator_concept.hpp - what the layers over an allocator (the std::pmr
// view, the recording adaptor) need of it: basic_allocator's interface.
#pragma once

#include <concepts>
#include <cstddef>

#include "concepts.hpp"
#include "stats.hpp"

namespace gmlake {

/// An allocator with stream-ordered reuse: basic_allocator, or an adaptor over one
/// (recording_allocator). `try_allocate(bytes, stream, alignment)` gives nullptr on
/// failure, `allocate` throws out_of_memory or backend_error, `deallocate(p, bytes,
/// stream)` never throws (bytes may be 0: unknown); `max_alignment()` bounds the
/// alignments it serves; `stats()` is a snapshot of its statistics.
template <class A>
concept StreamAllocator = PhysicalBackend<typename A::backend_type> &&
    std::same_as<typename A::stream_type, typename A::backend_type::stream_type> &&
    requires(A& a, const A& ca, void* p, std::size_t n, typename A::stream_type s) {
  { a.try_allocate(n, s, n) } noexcept -> std::same_as<void*>;
  { a.allocate(n, s, n) } -> std::same_as<void*>;
  { a.deallocate(p, n, s) } noexcept;
  { ca.chunk_size() } noexcept -> std::same_as<std::size_t>;
  { ca.max_alignment() } noexcept -> std::same_as<std::size_t>;
  { ca.stats() } -> std::same_as<statistics>;
};

} // namespace gmlake
