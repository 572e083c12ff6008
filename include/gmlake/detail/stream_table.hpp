// gmlake/detail/stream_table.hpp - which freed bytes each stream may reuse.
//
// A range freed on stream s carries the tag {s, q}: s's q-th free. It is reusable
// at once on s (stream order), and on another stream once an event recorded on s
// after that free has completed. Events are recorded lazily, only when another
// stream asks, and one per stream at a time: a later event on s covers every
// earlier free. A job with one stream records none for that.
//
// The stitch pool remaps a cached stitched block only once the work before its
// free is done, and never waits for it: it asks done_now(), which looks at a
// second event per stream, the mark, recorded after a stitched block's free
// (mark()) when none is outstanding, so that a later question finds the work
// done. Marks do not replace the events other streams wait on.
//
// A stream is its handle, unless the backend says more: a nonzero stream_key(s)
// names, among the streams that share handle s, the one this thread means (on CUDA
// the per-thread default stream, another stream on each thread). Such an entry is
// per key, and its events are recorded at each free, on the freeing thread, never
// later from another one, where the handle would name another stream.
//
// A stream about to be destroyed is forgotten (forget): its work done, as the
// caller promises, its frees count as done and its events go back, so nothing is
// ever recorded on the dead handle for them. A stream made later with the same
// handle takes the entry over: its frees count from there, pending as any.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../concepts.hpp"
#include "range.hpp"

namespace gmlake::detail {

template <PhysicalBackend Backend>
class stream_table {
 public:
  using stream_type = typename Backend::stream_type;
  using event_type = typename Backend::event_type;

  explicit stream_table(Backend& backend) : backend_(backend) {
    entries_.push_back(entry{});  // index 0: the default stream
  }
  stream_table(const stream_table&) = delete;
  stream_table& operator=(const stream_table&) = delete;
  ~stream_table() {
    for (auto& e : entries_) {
      if (e.has_event) backend_.destroy(e.event);
      if (e.has_mark) backend_.destroy(e.mark);
    }
  }

  /// The index of stream s, adding it if new. False only if memory ran out. A
  /// backend with stream identity (stream_key) tells apart streams that share a
  /// handle (on CUDA the per-thread default stream: one stream per thread).
  [[nodiscard]] bool index_of(stream_type s, std::uint32_t& out) noexcept {
    const std::uint64_t key = key_of(s);
    if (entries_[last_].is(s, key)) {
      out = last_;
      return true;
    }
    for (std::uint32_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].is(s, key)) {
        out = last_ = i;
        return true;
      }
    }
    try {
      entries_.push_back(entry{s, key});
    } catch (...) {
      return false;
    }
    out = last_ = static_cast<std::uint32_t>(entries_.size() - 1);
    return true;
  }

  /// The tag of a free on stream i, now. Where the backend asks for it (a handle
  /// that names another stream on another thread), the event is recorded here, on
  /// the freeing thread, where the handle names the stream the free was made on.
  [[nodiscard]] stream_tag on_free(std::uint32_t i) noexcept {
    entry& e = entries_[i];
    const stream_tag t{i, ++e.freed};
    if (e.shared() && !hold_) (void)record(e);
    return t;
  }

  /// True if the work before tag t's free is known to be done (no driver call).
  [[nodiscard]] bool known_done(stream_tag t) const noexcept {
    return t.seq <= entries_[t.stream].done;
  }

  /// May a range tagged t be used on stream i now? Queries (and if needed records)
  /// an event on t's stream.
  [[nodiscard]] bool usable(stream_tag t, std::uint32_t i) noexcept {
    if (t.stream == i || known_done(t)) return true;
    if (hold_) return false;
    entry& e = entries_[t.stream];
    if (!e.has_event || e.event_seq < t.seq) {
      if (!record_later(e)) return false;
    }
    auto done = backend_.query(e.event);
    if (!done || !done.value) return false;
    complete(e);
    return true;
  }

  /// Records the mark of t's stream after tag t's free, unless t is known done or
  /// a mark is outstanding (one that has completed is retired first). A failure to
  /// record only loses the mark.
  void mark(stream_tag t) noexcept {
    if (hold_ || known_done(t)) return;
    entry& e = entries_[t.stream];
    if (e.shared()) return;  // its free recorded an event already
    if (e.has_mark && !retire_mark(e)) return;
    auto ev = backend_.record(e.stream);
    if (!ev) return;
    e.mark = ev.value;
    e.mark_seq = e.freed;
    e.has_mark = true;
  }

  /// Is the work before tag t's free known done now? Queries the events already
  /// recorded on t's stream (the pending one if it covers t, the mark); never
  /// records one that the caller would wait on, never waits. If the answer is no
  /// and no mark covers t, records one for the next question.
  [[nodiscard]] bool done_now(stream_tag t) noexcept {
    if (known_done(t)) return true;
    if (hold_) return false;
    entry& e = entries_[t.stream];
    if (e.has_event && e.event_seq >= t.seq) {
      auto done = backend_.query(e.event);
      if (done && done.value) complete(e);
    }
    if (e.has_mark && !known_done(t) && !retire_mark(e)) return false;  // still pending: no newer one
    if (known_done(t)) return true;
    mark(t);
    return e.has_mark && retire_mark(e) && known_done(t);  // a mark just recorded covers t
  }

  /// Times the host waited for a stream's work (an event synchronize) so far.
  [[nodiscard]] std::uint64_t waits() const noexcept { return waits_; }

  /// Waits until the work before tag t's free is done. False on a backend failure.
  [[nodiscard]] bool wait(stream_tag t) noexcept {
    if (known_done(t)) return true;
    if (hold_) return false;
    entry& e = entries_[t.stream];
    if (!e.has_event || e.event_seq < t.seq) {
      if (!record_later(e)) return false;
    }
    if (backend_.synchronize(e.event) != errc::ok) return false;
    ++waits_;
    complete(e);
    return true;
  }

  /// Learns which frees are done now, on every stream, without waiting: queries the
  /// pending event of each stream with frees not known done, and where none covers
  /// its latest free records one after it and queries that. What is still running
  /// stays pending; a later call asks again.
  void poll_all() noexcept {
    if (hold_) return;
    for (entry& e : entries_) {
      if (e.done >= e.freed) continue;
      if (e.has_event) {
        auto done = backend_.query(e.event);
        if (done && done.value) complete(e);
      }
      if (e.done >= e.freed || (e.has_event && e.event_seq >= e.freed) || !record_later(e)) continue;
      auto done = backend_.query(e.event);
      if (done && done.value) complete(e);
    }
  }

  /// While held, no event is recorded, queried or waited on: work on another stream
  /// counts as pending unless already known done (CUDA graph capture).
  void set_hold(bool on) noexcept { hold_ = on; }

  /// Waits for the work queued on s so far, s having no entry (the table could not
  /// grow): an event recorded, waited for and destroyed. False if that cannot be
  /// done now (capture mode, or an event call failed).
  [[nodiscard]] bool drain(stream_type s) noexcept {
    if (hold_) return false;
    auto ev = backend_.record(s);
    if (!ev) return false;
    const bool ok = backend_.synchronize(ev.value) == errc::ok;
    backend_.destroy(ev.value);
    if (ok) ++waits_;
    return ok;
  }

  /// Stream s is done and about to be destroyed: its frees count as done and its
  /// events go back. Never the default stream (index 0), nor a handle shared by
  /// several streams (stream_key: its events are recorded at each free, on the
  /// freeing thread, never later).
  void forget(stream_type s) noexcept {
    if (key_of(s) != 0) return;
    for (std::uint32_t i = 1; i < entries_.size(); ++i) {
      entry& e = entries_[i];
      if (!e.is(s, 0)) continue;
      if (e.has_event) backend_.destroy(e.event);
      if (e.has_mark) backend_.destroy(e.mark);
      e.has_event = e.has_mark = false;
      e.done = e.freed;
    }
  }

  /// Waits for every stream's frees so far. False on a backend failure.
  [[nodiscard]] bool wait_all() noexcept {
    bool ok = true;
    for (std::uint32_t i = 0; i < entries_.size(); ++i)
      ok = wait({i, entries_[i].freed}) && ok;
    return ok;
  }

  /// The tag of a range made of two adjacent free ranges, or false if they must
  /// stay apart (freed on different streams, both with work pending).
  [[nodiscard]] bool merge(stream_tag a, stream_tag b, stream_tag& out) const noexcept {
    if (known_done(a)) out = b;
    else if (known_done(b)) out = a;
    else if (a.stream == b.stream) out = a.seq >= b.seq ? a : b;
    else return false;
    return true;
  }

 private:
  struct entry {
    stream_type stream{};
    std::uint64_t key = 0;        ///< stream_key: which of the streams sharing the handle (0: the handle's one)
    [[nodiscard]] bool shared() const noexcept { return key != 0; }
    [[nodiscard]] bool is(stream_type s, std::uint64_t k) const noexcept { return stream == s && key == k; }
    std::uint64_t freed = 0;      ///< frees on this stream so far
    std::uint64_t done = 0;       ///< frees known complete
    std::uint64_t event_seq = 0;  ///< frees the pending event covers
    event_type event{};
    bool has_event = false;
    std::uint64_t mark_seq = 0;   ///< frees the mark covers
    event_type mark{};
    bool has_mark = false;
  };

  /// Retires e's mark if it has completed (the frees it covers are then done).
  bool retire_mark(entry& e) noexcept {
    auto done = backend_.query(e.mark);
    if (!done || !done.value) return false;
    if (e.mark_seq > e.done) e.done = e.mark_seq;
    backend_.destroy(e.mark);
    e.has_mark = false;
    return true;
  }

  /// Records an event after e's latest free, now, for a question from any thread:
  /// not for a shared handle, whose free recorded its own (false).
  bool record_later(entry& e) noexcept { return !e.shared() && record(e); }

  bool record(entry& e) noexcept {
    auto ev = backend_.record(e.stream);
    if (!ev) return false;
    if (e.has_event) backend_.destroy(e.event);
    e.event = ev.value;
    e.event_seq = e.freed;
    e.has_event = true;
    return true;
  }
  void complete(entry& e) noexcept {
    if (e.event_seq > e.done) e.done = e.event_seq;
    backend_.destroy(e.event);
    e.has_event = false;
  }

  std::uint64_t key_of(stream_type s) noexcept {
    if constexpr (requires(Backend& b) { { b.stream_key(s) } -> std::convertible_to<std::uint64_t>; })
      return backend_.stream_key(s);
    else
      return 0;
  }

  Backend& backend_;
  std::vector<entry> entries_;
  std::uint32_t last_ = 0;
  std::uint64_t waits_ = 0;
  bool hold_ = false;
};

} // namespace gmlake::detail
