// gmlake/recording.hpp - recording_allocator: an adaptor over a gmlake allocator
// that writes every allocation and free to a trace (the format gmlake-replay reads,
// bench/traces/README.md), and memory_summary(): a text table of live and reserved
// memory, shaped like torch.cuda.memory_summary().
//
// What holds for all of it:
//  - recording_allocator does not own its allocator: it refers to one, which must
//    outlive it. It models StreamAllocator itself, so the std::pmr view (and, on the
//    CUDA backend, cuda_resource) can sit on top of it;
//  - the trace is text, one event per line, in program order: "a ID BYTES STREAM"
//    for each allocation served (BYTES as requested, STREAM as an integer, 0 for
//    the default stream), "f ID" for each free, "i N" for iteration marks, "# key
//    value" for metadata. A request that fails is not an event (a "# oom BYTES"
//    comment notes it). A path ending in ".gz" is written through `gzip -c`;
//  - thread safe: events are written under the adaptor's own lock, a free before
//    the block goes back to the allocator, so no reuse can be written ahead of it;
//  - recording never changes what the allocator does; if the trace cannot be
//    written (disk full, gzip gone, no memory for the id map), allocation goes on
//    and good() turns false (a write to gzip's pipe holds SIGPIPE off the writing
//    thread, so a reader gone does not end the process).
#pragma once

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "allocator_concept.hpp"
#include "detail/config.hpp"
#include "stats.hpp"

#if !defined(_WIN32)
#include <pthread.h>
#include <signal.h>
#endif

namespace gmlake {

// ---------------------------------------------------------------- memory_summary

namespace detail {
#if defined(_WIN32)
inline std::FILE* open_pipe(const char* command) noexcept { return ::_popen(command, "w"); }
inline int close_pipe(std::FILE* f) noexcept { return ::_pclose(f); }
struct pipe_write_guard {};
#else
inline std::FILE* open_pipe(const char* command) noexcept { return ::popen(command, "w"); }
inline int close_pipe(std::FILE* f) noexcept { return ::pclose(f); }

/// Holds SIGPIPE off the calling thread while it writes to a pipe: a write to a pipe
/// whose reader has gone (gzip ended: disk full, or killed) then fails with EPIPE
/// instead of ending the process. A SIGPIPE raised meanwhile is taken, not delivered;
/// one already pending before stays pending.
class pipe_write_guard {
 public:
  pipe_write_guard() noexcept {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe, &old_) == 0;
  }
  pipe_write_guard(const pipe_write_guard&) = delete;
  pipe_write_guard& operator=(const pipe_write_guard&) = delete;
  ~pipe_write_guard() {
    if (!blocked_) return;
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    if (!was_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      int taken = 0;
      (void)sigwait(&pipe, &taken);  // pending: returns at once
    }
    (void)pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t old_{};
  bool was_pending_ = false;
  bool blocked_ = false;
};
#endif

inline std::string human_bytes(std::int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n < 0 ? -n : n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%s%.0f %s" : "%s%.2f %s", n < 0 ? "-" : "", v, units[u]);
  return buf;
}
} // namespace detail

/// @brief A text table of `s`: for each gauge its value now, its peak, and the
///        totals allocated and freed (as torch.cuda.memory_summary()), then the
///        BestFit outcomes and the counters.
inline std::string memory_summary(const statistics& s) {
  std::string out;
  char line[160];
  const auto rule = [&] { out += std::string(79, '=') + "\n"; };
  const auto row = [&](const char* name, const stat& g, bool bytes) {
    const auto f = [&](std::int64_t v) { return bytes ? detail::human_bytes(v) : std::to_string(v); };
    std::snprintf(line, sizeof line, "| %-22s | %11s | %11s | %11s | %11s |\n", name, f(g.current).c_str(),
                  f(g.peak).c_str(), f(g.allocated).c_str(), f(g.freed).c_str());
    out += line;
  };
  rule();
  out += "|                  gmlake memory summary                                      |\n";
  rule();
  std::snprintf(line, sizeof line, "| %-22s | %11s | %11s | %11s | %11s |\n", "Metric", "Cur Usage", "Peak Usage",
                "Tot Alloc", "Tot Freed");
  out += line;
  rule();
  row("Requested memory", s.requested_bytes, true);
  row("Allocated memory", s.active_bytes, true);
  row("Reserved memory", s.reserved_bytes, true);
  row("Mapped memory (VA)", s.mapped_bytes, true);
  rule();
  row("Allocations", s.allocations, false);
  row("Physical chunks", s.chunks, false);
  row("Stitched blocks", s.stitched_blocks, false);
  rule();
  const double frag = s.reserved_bytes.peak > 0
                          ? 100.0 * (1.0 - static_cast<double>(s.active_bytes.peak) / static_cast<double>(s.reserved_bytes.peak))
                          : 0.0;
  std::snprintf(line, sizeof line, "| Peak allocated / peak reserved: %s / %s (%.1f%% unused at peak)\n",
                detail::human_bytes(s.active_bytes.peak).c_str(), detail::human_bytes(s.reserved_bytes.peak).c_str(),
                frag);
  out += line;
  std::snprintf(line, sizeof line,
                "| Requests: S1 exact %llu, S2 split %llu, S3 stitched %llu, S4 shortfall %llu, failed %llu\n",
                static_cast<unsigned long long>(s.fit[0]), static_cast<unsigned long long>(s.fit[1]),
                static_cast<unsigned long long>(s.fit[2]), static_cast<unsigned long long>(s.fit[3]),
                static_cast<unsigned long long>(s.fit[4]));
  out += line;
  std::snprintf(line, sizeof line, "| Cached stitch hits %llu, evictions %llu, retries %llu, OOMs %llu, invalid frees %llu\n",
                static_cast<unsigned long long>(s.cached_stitch_hits), static_cast<unsigned long long>(s.evictions),
                static_cast<unsigned long long>(s.num_alloc_retries), static_cast<unsigned long long>(s.num_ooms),
                static_cast<unsigned long long>(s.invalid_frees));
  out += line;
  rule();
  return out;
}

// ---------------------------------------------------------------- recording_allocator

/// @brief Records the allocations and frees made through it to a trace that
///        gmlake-replay reads, then forwards them to `Allocator`.
template <StreamAllocator Allocator>
class recording_allocator {
 public:
  using allocator_type = Allocator;
  using backend_type = typename Allocator::backend_type;
  using stream_type = typename Allocator::stream_type;

  /// @brief Records to the file at `path` (written through `gzip -c` when it ends
  ///        in ".gz", as gmlake-replay expects), with `workload` as metadata.
  /// @throws std::runtime_error if the file cannot be opened.
  recording_allocator(Allocator& a, const std::string& path, const std::string& workload = "")
      : a_(&a), path_(path) {
    gz_ = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
    if (gz_) {
      // The shell would report a file it cannot create only on stderr, and gzip would
      // be gone before the first write: create it here first, so that the error is
      // this constructor's.
      std::FILE* probe = std::fopen(path.c_str(), "w");
      if (probe == nullptr) throw std::runtime_error("gmlake::recording_allocator: cannot write " + path);
      std::fclose(probe);
      std::string quoted;  // the path in single quotes, for the shell
      for (char c : path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out_ = detail::open_pipe(("gzip -c > '" + quoted + "'").c_str());
      // A buffer larger than pipe_flush, so that only put()'s own flushes write to the
      // pipe, each under a pipe_write_guard.
      if (out_ != nullptr) {
        pipe_buffer_ = std::make_unique<char[]>(2 * pipe_flush);
        std::setvbuf(out_, pipe_buffer_.get(), _IOFBF, 2 * pipe_flush);
      }
    } else {
      out_ = std::fopen(path.c_str(), "w");
    }
    if (out_ == nullptr) throw std::runtime_error("gmlake::recording_allocator: cannot write " + path);
    owned_ = true;
    header(workload);
  }

  /// @brief Records to `out` (not closed here; flushed by close()).
  recording_allocator(Allocator& a, std::FILE* out, const std::string& workload = "") : a_(&a), out_(out) {
    header(workload);
  }

  recording_allocator(const recording_allocator&) = delete;
  recording_allocator& operator=(const recording_allocator&) = delete;
  ~recording_allocator() { close(); }

  // ------------------------------------------------------------ StreamAllocator

  /// @brief As the allocator's try_allocate; a block served is recorded.
  [[nodiscard]] void* try_allocate(std::size_t bytes, stream_type stream = {},
                                   std::size_t alignment = block_alignment) noexcept {
    void* p = a_->try_allocate(bytes, stream, alignment);
    note_allocate(p, bytes, stream);
    return p;
  }
  /// @brief As the allocator's allocate; a block served is recorded.
  /// @throws what the allocator throws (the failure is noted as a comment).
  [[nodiscard]] void* allocate(std::size_t bytes, stream_type stream = {},
                               std::size_t alignment = block_alignment) {
    void* p = nullptr;
    try {
      p = a_->allocate(bytes, stream, alignment);
    } catch (...) {
      note_allocate(nullptr, bytes, stream);
      throw;
    }
    note_allocate(p, bytes, stream);
    return p;
  }
  /// @brief Records the free, then forwards it.
  void deallocate(void* p, std::size_t bytes = 0, stream_type stream = {}) noexcept {
    if (p == nullptr) return;
    {
      std::lock_guard lock(mutex_);
      const auto it = ids_.find(p);
      if (it != ids_.end()) {
        live_ -= it->second.rounded;
        char line[32];
        std::snprintf(line, sizeof line, "f %llu\n", static_cast<unsigned long long>(it->second.id));
        put(line);
        ids_.erase(it);
      }
    }
    a_->deallocate(p, bytes, stream);
  }

  [[nodiscard]] std::size_t chunk_size() const noexcept { return a_->chunk_size(); }
  [[nodiscard]] std::size_t max_alignment() const noexcept { return a_->max_alignment(); }
  [[nodiscard]] statistics stats() const { return a_->stats(); }
  std::size_t release_cached() noexcept { return a_->release_cached(); }
  void forget_stream(stream_type stream) noexcept { a_->forget_stream(stream); }
  [[nodiscard]] bool check_invariants() const { return a_->check_invariants(); }
  [[nodiscard]] Allocator& allocator() const noexcept { return *a_; }

  // ------------------------------------------------------------ recording

  /// @brief Marks the start of iteration n ("i N"): gmlake-replay reports the
  ///        driver work after iteration 4, once the pool has warmed up.
  void mark_iteration(unsigned n) noexcept {
    std::lock_guard lock(mutex_);
    char line[32];
    std::snprintf(line, sizeof line, "i %u\n", n);
    put(line);
  }

  /// @brief Live bytes as gmlake-replay counts them (each request rounded up to
  ///        512 bytes), now and at their peak since recording began.
  [[nodiscard]] std::uint64_t live_bytes() const noexcept {
    std::lock_guard lock(mutex_);
    return live_;
  }
  [[nodiscard]] std::uint64_t peak_live_bytes() const noexcept {
    std::lock_guard lock(mutex_);
    return peak_live_;
  }
  /// @brief Allocation events written.
  [[nodiscard]] std::uint64_t events() const noexcept {
    std::lock_guard lock(mutex_);
    return next_id_;
  }
  /// @brief False once an event could not be written (the trace is incomplete).
  [[nodiscard]] bool good() const noexcept {
    std::lock_guard lock(mutex_);
    return good_;
  }

  /// @brief memory_summary() of the allocator, and what was recorded where.
  [[nodiscard]] std::string summary() const {
    std::string s = memory_summary(a_->stats());
    std::lock_guard lock(mutex_);
    char line[200];
    std::snprintf(line, sizeof line, "| Recorded: %llu allocations, %zu live (%s), peak live %s%s%s\n",
                  static_cast<unsigned long long>(next_id_), ids_.size(),
                  detail::human_bytes(static_cast<std::int64_t>(live_)).c_str(),
                  detail::human_bytes(static_cast<std::int64_t>(peak_live_)).c_str(),
                  path_.empty() ? "" : ", to ", path_.c_str());
    s += line;
    if (!good_) s += "| WARNING: some events could not be written; the trace is incomplete\n";
    return s;
  }

  /// @brief Finishes the trace (flushes; closes the file if this object opened it).
  ///        Later events are not written. Called by the destructor.
  /// @return good().
  bool close() noexcept {
    std::lock_guard lock(mutex_);
    if (out_ == nullptr) return good_;
    const detail::pipe_write_guard guard;
    if (std::fflush(out_) != 0) good_ = false;
    if (owned_) {
      const int rc = gz_ ? detail::close_pipe(out_) : std::fclose(out_);
      if (rc != 0) good_ = false;
    }
    out_ = nullptr;
    return good_;
  }

 private:
  struct record {
    std::uint64_t id;
    std::uint64_t bytes;
    std::uint64_t rounded;
  };

  static std::uintptr_t stream_number(stream_type s) noexcept {
    if constexpr (std::is_pointer_v<stream_type>) return reinterpret_cast<std::uintptr_t>(s);
    else return static_cast<std::uintptr_t>(s);
  }

  void header(const std::string& workload) {
    std::lock_guard lock(mutex_);
    if (!workload.empty()) {
      put("# workload ");
      put(workload.c_str());
      put("\n");
    }
    put("# source gmlake::recording_allocator\n");
  }

  /// Writes text. To gzip's pipe, the stream buffers up to pipe_flush bytes and
  /// put() flushes them under one pipe_write_guard (a text as long flushes itself,
  /// guarded): a guard per pipe write, not per event.
  void put(const char* text) noexcept {
    if (out_ == nullptr) return;
    const std::size_t n = std::strlen(text);
    if (!gz_ || (unflushed_ + n <= pipe_flush && n <= pipe_flush / 2)) {
      if (std::fputs(text, out_) < 0) good_ = false;
      unflushed_ += n;
      return;
    }
    const detail::pipe_write_guard guard;
    if (std::fflush(out_) != 0 || std::fputs(text, out_) < 0) good_ = false;
    unflushed_ = n;
  }

  void note_allocate(void* p, std::size_t bytes, stream_type stream) noexcept {
    std::lock_guard lock(mutex_);
    char line[80];
    if (p == nullptr) {
      std::snprintf(line, sizeof line, "# oom %llu %llu\n", static_cast<unsigned long long>(bytes),
                    static_cast<unsigned long long>(stream_number(stream)));
      put(line);
      return;
    }
    const std::uint64_t id = next_id_++;
    const std::uint64_t rounded = ((bytes == 0 ? 1 : bytes) + 511) / 512 * 512;
    try {
      ids_.insert_or_assign(p, record{id, bytes, rounded});
    } catch (...) {
      good_ = false;  // the free cannot be matched: the trace is incomplete
    }
    live_ += rounded;
    if (live_ > peak_live_) peak_live_ = live_;
    std::snprintf(line, sizeof line, "a %llu %llu %llu\n", static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(stream_number(stream)));
    put(line);
  }

  Allocator* a_;
  std::string path_;
  std::FILE* out_ = nullptr;
  bool owned_ = false;
  bool gz_ = false;
  static constexpr std::size_t pipe_flush = std::size_t{64} << 10;
  std::size_t unflushed_ = 0;  ///< bytes put to gzip's pipe since the last flush
  std::unique_ptr<char[]> pipe_buffer_;  ///< the pipe stream's buffer (closed before it goes)
  bool good_ = true;
  mutable std::mutex mutex_;
  std::unordered_map<void*, record> ids_;
  std::uint64_t next_id_ = 0;
  std::uint64_t live_ = 0, peak_live_ = 0;
};

} // namespace gmlake
