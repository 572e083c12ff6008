// gmlake/host_stream.hpp - the stream type of the host backends (host_memfd, simulated).
#pragma once

#include <cstdint>

namespace gmlake {

/// A stream of the host backends: a number; `host_stream{}` (0) is the default stream.
/// A type of its own, so that no size or alignment converts to it: with the stream
/// in the middle of `allocate(bytes, stream, alignment)`, `a.allocate(1000, 4096)`
/// does not compile. Write `a.allocate(1000, gmlake::host_stream{1}, 4096)`, or
/// `a.allocate(1000, {}, 4096)` on the default stream.
enum class host_stream : std::uintptr_t {};

} // namespace gmlake
