// gmlake/detail/host_streams.hpp - stand-in streams and events for the host backends.
//
// What holds for all of it:
//  - no work really runs: a stream is a number and two counters. `submitted` counts
//    the events recorded on it, `completed` how many of them have finished;
//  - an event {stream, ticket} has finished once `completed >= ticket`;
//  - in auto-complete mode (the default) work finishes as soon as it is recorded;
//    tests turn it off to hold work pending and finish it with `complete(s)`;
//  - every operation is `noexcept`; a container that cannot grow gives
//    errc::out_of_memory.
// Not thread-safe: the allocator calls its backend under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "../errors.hpp"
#include "../host_stream.hpp"

namespace gmlake::detail {

/// Streams and events of the host backends. Backends hold one and forward the
/// BackendStreams calls to it; `set_auto_complete`, `complete` and `pending` are test
/// hooks, not part of the concept.
class host_streams {
 public:
  /// Any value is a stream; host_stream{} (0) is the default stream.
  using stream_type = host_stream;

  /// Finishes when the `ticket`-th event recorded on `stream` has finished.
  /// A default-constructed event (ticket 0) has always finished.
  struct event_type {
    stream_type stream{};
    std::uint64_t ticket = 0;
    friend bool operator==(const event_type&, const event_type&) = default;
  };

  /// @brief Records an event after the work queued on `s` so far.
  /// @return the event, or errc::out_of_memory if the stream table cannot grow.
  [[nodiscard]] result<event_type> record(stream_type s) noexcept {
    entry* e = find_or_add(s);
    if (e == nullptr) return errc::out_of_memory;
    ++e->submitted;
    if (auto_complete_) e->completed = e->submitted;
    return event_type{s, e->submitted};
  }

  /// @brief Whether `e` has finished.
  /// @return errc::invalid for an event never recorded here.
  [[nodiscard]] result<bool> query(event_type e) const noexcept {
    if (e.ticket == 0) return true;
    const entry* x = find(e.stream);
    if (x == nullptr || e.ticket > x->submitted) return errc::invalid;
    return x->completed >= e.ticket;
  }

  /// @brief Waits for `e`: here, finishes the work on its stream up to it.
  /// @return errc::ok, or errc::invalid for an event never recorded here.
  [[nodiscard]] errc synchronize(event_type e) noexcept {
    if (e.ticket == 0) return errc::ok;
    entry* x = find(e.stream);
    if (x == nullptr || e.ticket > x->submitted) return errc::invalid;
    if (x->completed < e.ticket) x->completed = e.ticket;
    return errc::ok;
  }

  /// @brief Frees `e`. Events hold nothing here.
  void destroy(event_type) noexcept {}

  // ------------------------------------------------------------ test hooks

  /// @brief On (the default): recorded work finishes at once. Off: it stays pending
  /// until `complete(s)` or `synchronize(e)`.
  void set_auto_complete(bool on) noexcept { auto_complete_ = on; }
  [[nodiscard]] bool auto_complete() const noexcept { return auto_complete_; }

  /// @brief Finishes all work recorded on `s` so far.
  void complete(stream_type s) noexcept {
    if (entry* x = find(s)) x->completed = x->submitted;
  }

  /// @brief Finishes all work recorded on every stream so far.
  void complete_all() noexcept {
    for (entry& x : entries_) x.completed = x.submitted;
  }

  /// @brief Whether `s` has recorded work that has not finished.
  [[nodiscard]] bool pending(stream_type s) const noexcept {
    const entry* x = find(s);
    return x != nullptr && x->completed < x->submitted;
  }

 private:
  struct entry {
    stream_type stream{};
    std::uint64_t submitted = 0;
    std::uint64_t completed = 0;
  };

  // Few streams in practice: a linear scan beats hashing.
  [[nodiscard]] const entry* find(stream_type s) const noexcept {
    for (const entry& x : entries_)
      if (x.stream == s) return &x;
    return nullptr;
  }
  [[nodiscard]] entry* find(stream_type s) noexcept {
    for (entry& x : entries_)
      if (x.stream == s) return &x;
    return nullptr;
  }
  [[nodiscard]] entry* find_or_add(stream_type s) noexcept {
    if (entry* x = find(s)) return x;
    try {
      entries_.push_back(entry{s, 0, 0});
    } catch (...) {
      return nullptr;
    }
    return &entries_.back();
  }

  std::vector<entry> entries_;
  bool auto_complete_ = true;
};

} // namespace gmlake::detail
