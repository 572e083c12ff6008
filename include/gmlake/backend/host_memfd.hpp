// gmlake/backend/host_memfd.hpp - a host PhysicalBackend that really maps memory (Linux).
//
// What holds for all of it:
//  - physical memory is one memfd file of `capacity` bytes cut into granularity-sized
//    slots; a chunk is a run of contiguous slots, {offset in the file, size};
//  - a reservation is an anonymous PROT_NONE mapping aligned to the granularity;
//    `map` puts a chunk's file pages at an address inside one (MAP_FIXED, still
//    PROT_NONE), `set_access` makes them readable and writable, `unmap` puts the
//    anonymous PROT_NONE pages back so the reservation stays whole;
//  - as with CUDA, a chunk may be mapped at several addresses at once (aliasing), and
//    a released chunk's memory goes (its slots are freed and the hole punched) only
//    when its last mapping is gone;
//  - every concept call is `noexcept` and reports failure by value: errc::invalid
//    for a bad argument (state unchanged), errc::out_of_memory when no slots or no
//    address space are left, errc::driver when a system call fails;
//  - streams are the stand-ins of detail::host_streams (auto-complete by default).
// Not thread-safe: the allocator calls its backend under its own lock.
#pragma once

#if !defined(__linux__)
#  error "gmlake/backend/host_memfd.hpp needs Linux (memfd_create, MAP_FIXED, fallocate)"
#endif

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "../concepts.hpp"
#include "../detail/config.hpp"
#include "../detail/host_streams.hpp"
#include "../errors.hpp"

namespace gmlake::backend {

/// Host memory behind the CUDA VMM interface, for tests of everything above the
/// driver: the bytes are real, so data written through one mapping of a chunk can be
/// read through another. Non-copyable, cheaply movable; a moved-from object may only
/// be destroyed or assigned to.
class host_memfd : public detail::host_streams {
 public:
  /// A physical handle: `size` bytes at `offset` in the backing file.
  struct chunk_type {
    std::size_t offset = 0;
    std::size_t size = 0;
    friend bool operator==(const chunk_type&, const chunk_type&) = default;
  };
  using stream_type = detail::host_streams::stream_type;
  using event_type = detail::host_streams::event_type;

  static constexpr std::size_t default_granularity = std::size_t{2} << 20;  // 2 MiB

  /// @brief Makes the backing file.
  /// @param capacity physical bytes it can hold: a positive multiple of `granularity`.
  /// @param granularity chunk size unit: a positive multiple of the page size.
  /// @throws std::invalid_argument for bad sizes, gmlake::backend_error if the file
  ///         cannot be made.
  explicit host_memfd(std::size_t capacity, std::size_t granularity = default_granularity)
      : s_(std::make_unique<state>()) {
    const long page = ::sysconf(_SC_PAGESIZE);
    if (page <= 0) throw backend_error("gmlake::host_memfd: sysconf(_SC_PAGESIZE) failed");
    if (granularity == 0 || granularity % static_cast<std::size_t>(page) != 0)
      throw std::invalid_argument("gmlake::host_memfd: granularity must be a multiple of the page size");
    if (capacity == 0 || capacity % granularity != 0)
      throw std::invalid_argument("gmlake::host_memfd: capacity must be a positive multiple of the granularity");
    s_->granularity = granularity;
    s_->capacity = capacity;
    s_->slots.assign(capacity / granularity, slot_free);
    s_->fd = ::memfd_create("gmlake_host_memfd", MFD_CLOEXEC);
    if (s_->fd < 0) throw backend_error("gmlake::host_memfd: memfd_create failed");
    if (::ftruncate(s_->fd, static_cast<off_t>(capacity)) != 0)
      throw backend_error("gmlake::host_memfd: ftruncate failed");  // ~state closes the fd
  }

  host_memfd(const host_memfd&) = delete;
  host_memfd& operator=(const host_memfd&) = delete;
  host_memfd(host_memfd&&) noexcept = default;
  host_memfd& operator=(host_memfd&&) noexcept = default;
  ~host_memfd() = default;  // state's destructor unmaps every reservation, closes the file

  // ------------------------------------------------------------ BackendSizes

  [[nodiscard]] std::size_t granularity() const noexcept { return s_->granularity; }
  [[nodiscard]] std::size_t capacity() const noexcept { return s_->capacity; }

  // ------------------------------------------------------------ BackendAddressSpace

  /// @brief Reserves n bytes of address space, PROT_NONE, aligned to the granularity.
  /// @pre n is a positive multiple of granularity() (else errc::invalid).
  [[nodiscard]] result<std::uintptr_t> reserve(std::size_t n) noexcept {
    const std::size_t g = s_->granularity;
    if (!whole(n)) return errc::invalid;
    if (n > SIZE_MAX - g) return errc::out_of_memory;
    // Over-reserve by one granule, then trim both ends to the aligned n bytes.
    void* p = ::mmap(nullptr, n + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return errc::out_of_memory;
    const auto raw = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t va = round_up(raw, g);
    if (va > raw) ::munmap(p, va - raw);
    if (const std::uintptr_t end = raw + n + g; end > va + n)
      ::munmap(reinterpret_cast<void*>(va + n), end - (va + n));
    try {
      s_->reservations.emplace(va, n);
    } catch (...) {
      ::munmap(reinterpret_cast<void*>(va), n);
      return errc::out_of_memory;
    }
    return va;
  }

  /// @brief Gives back the whole reservation [va, va+n).
  /// @pre it is a reservation made here, and nothing is mapped in it (else errc::invalid).
  [[nodiscard]] errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    const auto it = s_->reservations.find(va);
    if (it == s_->reservations.end() || it->second != n) return errc::invalid;
    const auto m = s_->mappings.lower_bound(va);
    if (m != s_->mappings.end() && m->first < va + n) return errc::invalid;
    if (::munmap(reinterpret_cast<void*>(va), n) != 0) return errc::driver;
    s_->reservations.erase(it);
    return errc::ok;
  }

  // ------------------------------------------------------------ BackendChunks

  /// @brief Takes n bytes of contiguous free slots of the file (first fit).
  /// @pre n is a positive multiple of granularity() (else errc::invalid).
  /// @return errc::out_of_memory when no run of n / granularity() free slots is left.
  [[nodiscard]] result<chunk_type> create(std::size_t n) noexcept {
    if (!whole(n)) return errc::invalid;
    const std::size_t need = n / s_->granularity;
    std::vector<unsigned char>& slots = s_->slots;
    std::size_t run = 0;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      run = slots[i] == slot_free ? run + 1 : 0;
      if (run < need) continue;
      const std::size_t first = i + 1 - need;
      const chunk_type c{first * s_->granularity, n};
      try {
        s_->chunks.emplace(c.offset, chunk_record{n, 0, false});
      } catch (...) {
        return errc::out_of_memory;
      }
      for (std::size_t j = first; j <= i; ++j) slots[j] = slot_used;
      s_->created_bytes += n;
      return c;
    }
    return errc::out_of_memory;
  }

  /// @brief Drops the handle c. Its memory goes now if c is not mapped anywhere,
  /// else at its last unmap.
  /// @pre c was created here and not released yet (else errc::invalid).
  [[nodiscard]] errc release(chunk_type c) noexcept {
    const auto it = live_chunk(c);
    if (it == s_->chunks.end()) return errc::invalid;
    it->second.released = true;
    if (it->second.maps == 0) reclaim(it);
    return errc::ok;
  }

  // ------------------------------------------------------------ BackendMapping

  /// @brief Maps all of chunk c at [va, va+n), without access yet.
  /// @pre va is granularity-aligned, [va, va+n) lies in one reservation with nothing
  ///      mapped there, n == c.size, c is live (else errc::invalid).
  [[nodiscard]] errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept {
    if (!whole(n) || va % s_->granularity != 0 || n != c.size) return errc::invalid;
    const auto chunk = live_chunk(c);
    if (chunk == s_->chunks.end() || !reserved(va, n)) return errc::invalid;
    // Nothing mapped in [va, va+n): the mapping before ends by va, the next starts at va+n or later.
    auto next = s_->mappings.lower_bound(va);
    if (next != s_->mappings.end() && next->first < va + n) return errc::invalid;
    if (next != s_->mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > va)
      return errc::invalid;
    std::map<std::uintptr_t, chunk_type>::iterator at;
    try {
      at = s_->mappings.emplace_hint(next, va, c);
    } catch (...) {
      return errc::out_of_memory;
    }
    void* p = ::mmap(reinterpret_cast<void*>(va), n, PROT_NONE, MAP_SHARED | MAP_FIXED, s_->fd,
                     static_cast<off_t>(c.offset));
    if (p == MAP_FAILED) {
      s_->mappings.erase(at);
      return errc::driver;
    }
    ++chunk->second.maps;
    return errc::ok;
  }

  /// @brief Makes [va, va+n) readable and writable.
  /// @pre va and n are granularity-aligned, n > 0, every granule of the range is mapped
  ///      (else errc::invalid).
  [[nodiscard]] errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    if (!whole(n) || va % s_->granularity != 0) return errc::invalid;
    // Walk the mappings from the one holding va; they must tile the range with no gap.
    auto it = s_->mappings.upper_bound(va);
    if (it == s_->mappings.begin()) return errc::invalid;
    --it;
    std::uintptr_t covered = va;
    const std::uintptr_t end = va + n;
    while (covered < end) {
      if (it == s_->mappings.end() || it->first > covered) return errc::invalid;
      const std::uintptr_t e = it->first + it->second.size;
      if (e <= covered) return errc::invalid;
      covered = e;
      ++it;
    }
    if (::mprotect(reinterpret_cast<void*>(va), n, PROT_READ | PROT_WRITE) != 0) return errc::driver;
    return errc::ok;
  }

  /// @brief Unmaps the mappings that cover exactly [va, va+n); the reservation stays.
  /// A released chunk whose last mapping this was goes now.
  /// @pre [va, va+n) starts and ends at mapping boundaries with no gap (else errc::invalid).
  [[nodiscard]] errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    if (n == 0) return errc::invalid;
    const auto first = s_->mappings.find(va);
    if (first == s_->mappings.end()) return errc::invalid;
    auto last = first;
    std::uintptr_t covered = va;
    const std::uintptr_t end = va + n;
    while (covered < end) {
      if (last == s_->mappings.end() || last->first != covered) return errc::invalid;
      covered += last->second.size;
      ++last;
    }
    if (covered != end) return errc::invalid;  // the last mapping runs past va+n
    void* p = ::mmap(reinterpret_cast<void*>(va), n, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return errc::driver;
    for (auto it = first; it != last;) {
      const auto chunk = s_->chunks.find(it->second.offset);
      GMLAKE_ASSERT(chunk != s_->chunks.end() && chunk->second.maps > 0, "host_memfd: mapping of an unknown chunk");
      if (--chunk->second.maps == 0 && chunk->second.released) reclaim(chunk);
      it = s_->mappings.erase(it);
    }
    return errc::ok;
  }

  // ------------------------------------------------------------ inspection (tests)

  /// Bytes of the file held by chunks, released or not, that still have memory behind
  /// them (a released chunk counts until its last unmap).
  [[nodiscard]] std::size_t created_bytes() const noexcept { return s_->created_bytes; }
  /// Live reservations.
  [[nodiscard]] std::size_t reservation_count() const noexcept { return s_->reservations.size(); }
  /// Live mappings (one per map call not yet unmapped).
  [[nodiscard]] std::size_t mapping_count() const noexcept { return s_->mappings.size(); }
  /// Chunks with memory behind them (live, or released but still mapped).
  [[nodiscard]] std::size_t chunk_count() const noexcept { return s_->chunks.size(); }

  /// @brief The offset in the backing file of the byte mapped at va.
  /// @return errc::invalid if no chunk is mapped at va.
  [[nodiscard]] result<std::size_t> offset_of(std::uintptr_t va) const noexcept {
    auto it = s_->mappings.upper_bound(va);
    if (it == s_->mappings.begin()) return errc::invalid;
    --it;
    if (va - it->first >= it->second.size) return errc::invalid;
    return it->second.offset + (va - it->first);
  }

  /// @brief Reads n bytes of the backing file at `offset` with pread, through no
  ///        mapping: what the chunks hold, whatever is mapped where.
  /// @return false if the read fails or is short.
  [[nodiscard]] bool read_file(std::size_t offset, void* out, std::size_t n) const noexcept {
    if (offset > s_->capacity || n > s_->capacity - offset) return false;
    const ssize_t got = ::pread(s_->fd, out, n, static_cast<off_t>(offset));
    return got >= 0 && static_cast<std::size_t>(got) == n;
  }

 private:
  static constexpr unsigned char slot_free = 0;
  static constexpr unsigned char slot_used = 1;

  struct chunk_record {
    std::size_t size = 0;
    std::size_t maps = 0;   ///< live mappings of this chunk
    bool released = false;  ///< handle dropped; memory goes at maps == 0
  };

  struct state {
    int fd = -1;
    std::size_t granularity = 0;
    std::size_t capacity = 0;
    std::size_t created_bytes = 0;
    std::vector<unsigned char> slots;                       ///< one per granule of the file
    std::map<std::size_t, chunk_record> chunks;             ///< by offset in the file
    std::map<std::uintptr_t, std::size_t> reservations;     ///< va -> bytes
    std::map<std::uintptr_t, chunk_type> mappings;          ///< va -> chunk mapped there

    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      // Mappings lie inside reservations: unmapping these drops them all.
      for (const auto& [va, n] : reservations) ::munmap(reinterpret_cast<void*>(va), n);
      if (fd >= 0) ::close(fd);
    }
  };

  [[nodiscard]] bool whole(std::size_t n) const noexcept { return n != 0 && n % s_->granularity == 0; }

  /// The record of c if c is a live (not released) chunk made here.
  [[nodiscard]] std::map<std::size_t, chunk_record>::iterator live_chunk(const chunk_type& c) const noexcept {
    const auto it = s_->chunks.find(c.offset);
    if (it == s_->chunks.end() || it->second.size != c.size || it->second.released) return s_->chunks.end();
    return it;
  }

  /// Whether [va, va+n) lies inside one reservation.
  [[nodiscard]] bool reserved(std::uintptr_t va, std::size_t n) const noexcept {
    auto it = s_->reservations.upper_bound(va);
    if (it == s_->reservations.begin()) return false;
    --it;
    return va + n >= va && va + n <= it->first + it->second;
  }

  /// The chunk is released and unmapped: free its slots and give its pages back.
  void reclaim(std::map<std::size_t, chunk_record>::iterator it) noexcept {
    const std::size_t offset = it->first;
    const std::size_t size = it->second.size;
    // Failure only means the pages stay resident until the file is closed.
    (void)::fallocate(s_->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                      static_cast<off_t>(size));
    const std::size_t first = offset / s_->granularity;
    for (std::size_t j = first; j < first + size / s_->granularity; ++j) s_->slots[j] = slot_free;
    s_->created_bytes -= size;
    s_->chunks.erase(it);
  }

  std::unique_ptr<state> s_;
};

static_assert(PhysicalBackend<host_memfd> && BackendMemoryAccessible<host_memfd>);

} // namespace gmlake::backend
