// gmlake/backend/simulated.hpp - a PhysicalBackend with no memory behind it.
//
// What holds for all of it:
//  - addresses are arithmetic only: nothing is reserved or mapped, nothing may be
//    dereferenced. It exists to replay large traces fast, where the allocator's own
//    CPU cost per operation is what is measured, so every call is O(1) and allocates
//    nothing;
//  - checks are cheap and partial: alignment, sizes, and counters of what is live
//    (reservations, chunks, mapped bytes); a call that fails them returns errc::invalid
//    and changes nothing. It does not catch every misuse (say, unmapping a range that
//    was never mapped while another one is);
//  - `create` fails with errc::out_of_memory once the chunks held would pass `capacity`;
//    a chunk counts as held from `create` to `release` (the allocator unmaps first);
//  - address space is handed out by a bump pointer and never reused;
//  - streams are the stand-ins of detail::host_streams (auto-complete by default).
// Not thread-safe: the allocator calls its backend under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../concepts.hpp"
#include "../detail/config.hpp"
#include "../detail/host_streams.hpp"
#include "../errors.hpp"

namespace gmlake::backend {

/// Address arithmetic behind the CUDA VMM interface.
class simulated : public detail::host_streams {
 public:
  /// A physical handle: a serial number (from 1) and its size.
  struct chunk_type {
    std::uint64_t id = 0;
    std::size_t size = 0;
    friend bool operator==(const chunk_type&, const chunk_type&) = default;
  };
  using stream_type = detail::host_streams::stream_type;
  using event_type = detail::host_streams::event_type;
  /// Nothing may be dereferenced (BackendMemoryAccessible is false).
  static constexpr bool memory_accessible = false;

  static constexpr std::size_t default_capacity = std::size_t{1} << 40;     // 1 TiB
  static constexpr std::size_t default_granularity = std::size_t{2} << 20;  // 2 MiB
  /// The first address `reserve` hands out.
  static constexpr std::uintptr_t base_address = 0x100000000000;

  /// @param capacity physical bytes it can hold.
  /// @param granularity chunk size unit; a positive power of two is expected, any
  ///        positive value works. 0 is taken as default_granularity.
  explicit simulated(std::size_t capacity = default_capacity,
                     std::size_t granularity = default_granularity) noexcept
      : capacity_(capacity),
        granularity_(granularity == 0 ? default_granularity : granularity),
        next_va_(round_up(base_address, granularity_)) {}

  // ------------------------------------------------------------ BackendSizes

  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  // ------------------------------------------------------------ BackendAddressSpace

  /// @pre n is a positive multiple of granularity() (else errc::invalid).
  /// @return the next n bytes of the bump pointer; errc::out_of_memory when the
  ///         64-bit space runs out.
  [[nodiscard]] result<std::uintptr_t> reserve(std::size_t n) noexcept {
    if (!whole(n)) return errc::invalid;
    if (n > UINTPTR_MAX - next_va_) return errc::out_of_memory;
    const std::uintptr_t va = next_va_;
    next_va_ += n;
    ++reservations_;
    reserved_bytes_ += n;
    return va;
  }

  /// @pre [va, va+n) lies in the space handed out, and that many bytes are reserved
  ///      (else errc::invalid).
  [[nodiscard]] errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    if (!whole(n) || !handed_out(va, n) || reservations_ == 0 || reserved_bytes_ < n) return errc::invalid;
    --reservations_;
    reserved_bytes_ -= n;
    return errc::ok;
  }

  // ------------------------------------------------------------ BackendChunks

  /// @pre n is a positive multiple of granularity() (else errc::invalid).
  /// @return errc::out_of_memory when created_bytes() + n would pass capacity().
  [[nodiscard]] result<chunk_type> create(std::size_t n) noexcept {
    if (!whole(n)) return errc::invalid;
    if (n > capacity_ - created_bytes_) return errc::out_of_memory;
    created_bytes_ += n;
    ++chunks_;
    return chunk_type{next_id_++, n};
  }

  /// @pre c came from create() and is held (else, as far as the counters tell, errc::invalid).
  [[nodiscard]] errc release(chunk_type c) noexcept {
    if (!known(c) || chunks_ == 0 || created_bytes_ < c.size) return errc::invalid;
    --chunks_;
    created_bytes_ -= c.size;
    return errc::ok;
  }

  // ------------------------------------------------------------ BackendMapping

  /// @pre va granularity-aligned, [va, va+n) in the space handed out, n == c.size,
  ///      c came from create() (else errc::invalid).
  [[nodiscard]] errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept {
    if (n != c.size || !whole(n) || !known(c) || !handed_out(va, n)) return errc::invalid;
    mapped_bytes_ += n;
    return errc::ok;
  }

  /// @pre va granularity-aligned, n a positive multiple of granularity(), at most
  ///      mapped_bytes() (else errc::invalid).
  [[nodiscard]] errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    if (!whole(n) || !handed_out(va, n) || n > mapped_bytes_) return errc::invalid;
    return errc::ok;
  }

  /// @pre as set_access.
  [[nodiscard]] errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    if (!whole(n) || !handed_out(va, n) || n > mapped_bytes_) return errc::invalid;
    mapped_bytes_ -= n;
    return errc::ok;
  }

  // ------------------------------------------------------------ inspection (tests)

  /// Physical bytes held: chunks created and not released.
  [[nodiscard]] std::size_t created_bytes() const noexcept { return created_bytes_; }
  /// Chunks created and not released.
  [[nodiscard]] std::size_t chunk_count() const noexcept { return chunks_; }
  /// Bytes mapped and not unmapped.
  [[nodiscard]] std::size_t mapped_bytes() const noexcept { return mapped_bytes_; }
  /// Bytes reserved and not freed.
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_bytes_; }
  /// Reservations not freed.
  [[nodiscard]] std::size_t reservation_count() const noexcept { return reservations_; }

 private:
  [[nodiscard]] bool whole(std::size_t n) const noexcept { return n != 0 && n % granularity_ == 0; }
  [[nodiscard]] bool handed_out(std::uintptr_t va, std::size_t n) const noexcept {
    return va % granularity_ == 0 && va >= base_address && va <= next_va_ && n <= next_va_ - va;
  }
  [[nodiscard]] bool known(const chunk_type& c) const noexcept { return c.id != 0 && c.id < next_id_; }

  std::size_t capacity_;
  std::size_t granularity_;
  std::uintptr_t next_va_;
  std::uint64_t next_id_ = 1;
  std::size_t created_bytes_ = 0;
  std::size_t chunks_ = 0;
  std::size_t mapped_bytes_ = 0;
  std::size_t reserved_bytes_ = 0;
  std::size_t reservations_ = 0;
};

static_assert(PhysicalBackend<simulated> && !BackendMemoryAccessible<simulated>);

} // namespace gmlake::backend
