// gmlake/detail/settling.hpp - whether the job has settled: it goes on asking for
// memory, but its footprint has stopped growing.
//
// A training loop forms its layout in its first iterations and then repeats it;
// what grows after that comes from new shapes (a longer sequence, a larger batch).
// Judged in windows of requested bytes: each time the job has asked for `window` x
// its reserved bytes since the last judgement, it is settled if its reserved bytes
// grew by at most 1/divisor over that window. Once settled it stays so until reset
// (release_cached): growth after that is the new shapes of a formed layout. The
// growth rules may then create coarser chunks (policy/growth.hpp, settled_max_chunk).
#pragma once

#include <cstddef>

namespace gmlake::detail {

class settling {
 public:
  /// window 0: never settled. divisor 0 counts as 1.
  constexpr settling(std::size_t window, std::size_t divisor) noexcept
      : window_(window), divisor_(divisor == 0 ? 1 : divisor) {}

  /// A request of `bytes` was made; the allocator now holds `reserved` bytes.
  constexpr void on_request(std::size_t bytes, std::size_t reserved) noexcept {
    if (window_ == 0 || settled_) return;
    asked_ = asked_ + bytes < asked_ ? static_cast<std::size_t>(-1) : asked_ + bytes;
    if (asked_ / window_ < reserved) return;  // the window is not over
    settled_ = mark_ != 0 && reserved - (reserved > mark_ ? mark_ : reserved) <= mark_ / divisor_;
    mark_ = reserved;
    asked_ = 0;
  }

  /// Starts over (the footprint was released: a new layout forms).
  constexpr void reset() noexcept {
    asked_ = mark_ = 0;
    settled_ = false;
  }

  [[nodiscard]] constexpr bool settled() const noexcept { return settled_; }

 private:
  std::size_t window_, divisor_;
  std::size_t asked_ = 0;  ///< bytes requested since the last judgement
  std::size_t mark_ = 0;   ///< reserved bytes at the last judgement (0: none yet)
  bool settled_ = false;
};

} // namespace gmlake::detail
