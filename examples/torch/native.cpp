// examples/torch/native.cpp - gmlake behind PyTorch's own CUDA allocator interface.
//
// The extension module _gmlake_torch (used through gmlake_torch.py) installs one object of class
// `native_allocator`, a c10::cuda::CUDACachingAllocator::CUDAAllocator, as
// PyTorch's CUDA allocator. Every torch.cuda memory call then reaches gmlake:
// allocation and free, memory_stats() and what is built on it, empty_cache(),
// set_per_process_memory_fraction(), Tensor.record_stream(), CUDA graph private
// pools, and _record_memory_history() / _snapshot().
//
// Per device:
//  - one gmlake allocator (CUDA VMM backend) serves every request outside a graph
//    capture;
//  - each graph memory pool (MempoolId_t) is a gmlake allocator of its own, made
//    when a capture first allocates into it. Memory used inside a capture stays in
//    its pool until the pool's last graph is destroyed and its last block freed, so
//    a replay never writes into a block handed out afterwards. Stitching works
//    inside a pool as anywhere else;
//  - while a capture is under way on the device, no allocator waits on, records or
//    queries events, or releases memory (gmlake's capture mode), and driver calls
//    run in the relaxed capture mode, as PyTorch's own allocator does;
//  - a block used on other streams (record_stream) goes back to gmlake only once
//    events recorded on those streams at its free have completed;
//  - set_per_process_memory_fraction caps the physical memory of the device's
//    allocator and its graph pools together, as PyTorch's own allocator does.
//
// One mutex per device guards this file's state; gmlake's allocators have their own.
// The history (memory snapshots, trace trackers, out-of-memory observers) has one
// more, taken after a device's when both are held.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <gmlake/allocator.hpp>
#include <gmlake/backend/cuda_vmm.hpp>
#include <gmlake/configs.hpp>
#include <gmlake/settings.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using c10::MempoolId_t;
using core = gmlake::allocator<gmlake::backend::cuda_vmm>;
using stat_array = c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;

constexpr std::size_t small_max = std::size_t{1} << 20;  // PyTorch's small pool: requests up to 1 MiB
constexpr std::size_t rounding = gmlake::block_alignment;  // gmlake places requests in 512 B multiples

std::size_t placed_size(std::size_t n) noexcept { return (n + rounding - 1) / rounding * rounding; }

std::string format_size(std::uint64_t n) {
  char buf[64];
  if (n < 1024) std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes", n);
  else if (n < (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f KiB", n / 1024.0);
  else if (n < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f MiB", n / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
  return buf;
}

struct pool;

/// One live allocation.
struct block {
  void* ptr = nullptr;
  std::size_t size = 0;  // bytes asked for
  cudaStream_t stream = nullptr;
  DeviceIndex device = 0;
  pool* owner = nullptr;  // the graph pool it came from; nullptr: the device's allocator
  std::vector<cudaStream_t> uses;  // other streams it was used on (record_stream)
  std::shared_ptr<c10::GatheredContext> context;
};

/// A graph memory pool: its own gmlake allocator, in capture mode for its whole life.
struct pool {
  MempoolId_t id;
  std::unique_ptr<core> alloc;
  int use_count = 0;       // captures and MemPools holding it
  bool use_on_oom = false; // MemPool(use_on_oom=True): serves the device's requests it cannot
  std::size_t live = 0;    // blocks not yet freed
};

/// A free waiting for events on the streams the block was used on.
struct pending_free {
  block* b;
  std::vector<cudaEvent_t> events;
};

/// Totals shaped like PyTorch's, kept by request class (small: up to 1 MiB).
struct request_stats {
  stat_array allocation, active, allocated_bytes, active_bytes, requested_bytes;
  std::int64_t num_ooms = 0;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_sync_all_streams = 0;

  void on_alloc(std::size_t n) {
    for (auto t : types(n)) {
      allocation[t].increase(1);
      active[t].increase(1);
      allocated_bytes[t].increase(placed_size(n));
      active_bytes[t].increase(placed_size(n));
      requested_bytes[t].increase(n);
    }
  }
  void on_free(std::size_t n) {
    for (auto t : types(n)) {
      allocation[t].decrease(1);
      active[t].decrease(1);
      allocated_bytes[t].decrease(placed_size(n));
      active_bytes[t].decrease(placed_size(n));
      requested_bytes[t].decrease(n);
    }
  }
  static std::array<std::size_t, 2> types(std::size_t n) {
    return {static_cast<std::size_t>(StatType::AGGREGATE),
            static_cast<std::size_t>(n <= small_max ? StatType::SMALL_POOL : StatType::LARGE_POOL)};
  }
};

/// The gmlake-side counters at the last reset_accumulated_memory_stats(), so that
/// the figures PyTorch reads count from there.
struct accumulated_base {
  std::int64_t device_alloc = 0, device_free = 0, retries = 0, waits = 0;
  std::int64_t reserved_allocated = 0, reserved_freed = 0, segments_allocated = 0, segments_freed = 0;
};

struct device_state {
  std::mutex m;
  std::unique_ptr<core> main;   // made once, under m, by the first call that needs it
  std::atomic<bool> made{false};  // main is made (for readers that do not hold m)
  double fraction = 1.0;        // set_per_process_memory_fraction: of the device allocator and graph pools together
  bool capped = false;          // the fraction's limits are set on the allocators (apply_fraction)
  accumulated_base base;
  gmlake::statistics retired;   // the counts of graph pools destroyed
  std::map<MempoolId_t, std::unique_ptr<pool>> pools;
  std::vector<std::pair<MempoolId_t, std::function<bool(cudaStream_t)>>> captures;  // under way
  std::deque<pending_free> pending;          // record_stream frees waiting for events
  std::vector<block*> deferred;              // record_stream frees made during a capture
  std::vector<cudaEvent_t> spare_events;
  request_stats stats;
  // reserved bytes and chunks by arena (small pool: the small arena), sampled when
  // the statistics are read, with their peaks over those samples
  c10::CachingAllocator::Stat reserved_small, reserved_large, segments_small, segments_large;
  std::vector<cca::TraceEntry> trace;        // history while recording
  std::size_t trace_next = 0;                // ring position once full
  std::size_t trace_max = 0;                 // the ring's size (max_entries when it was last ordered)
};

/// Every live block by pointer, in shards (frees come from any thread, for any device).
class block_map {
 public:
  void insert(block* b) {
    shard& s = at(b->ptr);
    std::lock_guard lock(s.m);
    s.map.emplace(b->ptr, b);
  }
  block* find(void* p) {
    shard& s = at(p);
    std::lock_guard lock(s.m);
    auto it = s.map.find(p);
    return it == s.map.end() ? nullptr : it->second;
  }
  block* take(void* p) {
    shard& s = at(p);
    std::lock_guard lock(s.m);
    auto it = s.map.find(p);
    if (it == s.map.end()) return nullptr;
    block* b = it->second;
    s.map.erase(it);
    return b;
  }
  template <class F>
  void for_each(F f) {
    for (shard& s : shards_) {
      std::lock_guard lock(s.m);
      for (auto& [p, b] : s.map) f(b);
    }
  }

 private:
  struct shard {
    std::mutex m;
    std::unordered_map<void*, block*> map;
  };
  shard& at(void* p) { return shards_[(reinterpret_cast<std::uintptr_t>(p) >> 9) % shards_.size()]; }
  std::array<shard, 32> shards_;
};

/// A checkpoint of a graph pool (CUDA graph trees): its live blocks.
struct pool_state : cca::AllocatorState {
  DeviceIndex device = 0;
  MempoolId_t id;
  std::vector<std::pair<void*, std::size_t>> blocks;
};

/// gmlake's misuse reports (double or foreign free) must not abort a training job.
thread_local char last_misuse[256] = "";
void on_misuse(const char* what, void* p) noexcept {
  std::snprintf(last_misuse, sizeof last_misuse, "gmlake: misuse: %s (%p)", what, p);
}

class native_allocator final : public cca::CUDAAllocator {
 public:
  using cca::CUDAAllocator::recordStream;

  // ---------------------------------------------------------------- c10::Allocator

  c10::DataPtr allocate(std::size_t n) override {
    const DeviceIndex dev = c10::cuda::current_device();
    const cudaStream_t s = c10::cuda::getCurrentCUDAStream(dev).stream();
    void* p = n == 0 ? nullptr : make_block(dev, n, s)->ptr;
    // As PyTorch's own allocator: context = pointer, deleter = raw_deleter() (CUDA
    // graph trees swap deleters and compare them with raw_deleter()).
    return {p, p, &free_raw, c10::Device(c10::DeviceType::CUDA, dev)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_raw; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---------------------------------------------------------------- DeviceAllocator

  bool initialized() override { return initialized_.load(); }

  void emptyCache(MempoolId_t /*mempool_id*/) override {
    for_each_device([&](device_state& d) {
      std::lock_guard lock(d.m);
      if (!d.captures.empty()) return;  // nothing is released while a capture is under way
      settle_pending(d, true);
      release_retired_pools(d);
      d.main->release_cached();
    });
  }

  // The statistics calls make no allocator (that would open a context on the device):
  // a device gmlake has not served reads as zeros.

  cca::DeviceStats getDeviceStats(DeviceIndex device) override {
    device_state& d = slot(device);
    std::lock_guard lock(d.m);
    cca::DeviceStats r;
    const request_stats& q = d.stats;
    r.allocation = q.allocation;
    r.active = q.active;
    r.allocated_bytes = q.allocated_bytes;
    r.active_bytes = q.active_bytes;
    r.requested_bytes = q.requested_bytes;
    r.num_ooms = q.num_ooms;
    gmlake::statistics g = totals(d);
    const accumulated_base now = accumulated(g);
    const accumulated_base& b = d.base;
    r.num_sync_all_streams = q.num_sync_all_streams + since(now.waits, b.waits);
    r.num_alloc_retries = q.num_alloc_retries + since(now.retries, b.retries);
    sample_reserved(d);
    const auto agg = static_cast<std::size_t>(StatType::AGGREGATE);
    const auto sm = static_cast<std::size_t>(StatType::SMALL_POOL);
    const auto lg = static_cast<std::size_t>(StatType::LARGE_POOL);
    copy(r.reserved_bytes[agg], g.reserved_bytes);
    r.reserved_bytes[agg].allocated = since(now.reserved_allocated, b.reserved_allocated);
    r.reserved_bytes[agg].freed = since(now.reserved_freed, b.reserved_freed);
    copy(r.segment[agg], g.chunks);
    r.segment[agg].allocated = since(now.segments_allocated, b.segments_allocated);
    r.segment[agg].freed = since(now.segments_freed, b.segments_freed);
    r.reserved_bytes[sm] = d.reserved_small;
    r.reserved_bytes[lg] = d.reserved_large;
    r.segment[sm] = d.segments_small;
    r.segment[lg] = d.segments_large;
    r.num_device_alloc = since(now.device_alloc, b.device_alloc);
    r.num_device_free = since(now.device_free, b.device_free);
    r.max_split_size = -1;
    return r;
  }

  void resetAccumulatedStats(DeviceIndex device) override {
    device_state& d = slot(device);
    std::lock_guard lock(d.m);
    sample_reserved(d);  // the arenas' figures as they are now, then reset
    for_each_stat(d, [](c10::CachingAllocator::Stat& s) { s.reset_accumulated(); });
    d.stats.num_ooms = d.stats.num_alloc_retries = d.stats.num_sync_all_streams = 0;
    d.base = accumulated(totals(d));  // device allocations and frees, retries, waits, reserved and segments
  }

  void resetPeakStats(DeviceIndex device) override {
    device_state& d = slot(device);
    std::lock_guard lock(d.m);
    sample_reserved(d);
    for_each_stat(d, [](c10::CachingAllocator::Stat& s) { s.reset_peak(); });
    if (d.main) d.main->reset_peaks();
    for (auto& [id, p] : d.pools) p->alloc->reset_peaks();
    for (gmlake::stat* g : gauges(d.retired)) g->peak = 0;
  }

  /// Calls f on each of the device's PyTorch statistics that a reset changes.
  template <class F>
  static void for_each_stat(device_state& d, F f) {
    for (stat_array* a : {&d.stats.allocation, &d.stats.active, &d.stats.allocated_bytes, &d.stats.active_bytes,
                          &d.stats.requested_bytes})
      for (auto& s : *a) f(s);
    for (auto* s : {&d.reserved_small, &d.reserved_large, &d.segments_small, &d.segments_large}) f(*s);
  }

  /// The device's free and total bytes (cudaMemGetInfo); zeros when CUDA cannot tell.
  static std::pair<std::size_t, std::size_t> device_memory(DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      (void)cudaGetLastError();
      return {0, 0};
    }
    return {free_b, total_b};
  }

  // ---------------------------------------------------------------- CUDAAllocator

  void* raw_alloc(std::size_t n) override {
    const DeviceIndex dev = c10::cuda::current_device();
    return raw_alloc_with_stream(n, c10::cuda::getCurrentCUDAStream(dev).stream());
  }

  void* raw_alloc_with_stream(std::size_t n, cudaStream_t s) override {
    if (n == 0) return nullptr;
    block* b = make_block(c10::cuda::current_device(), n, s);
    return b->ptr;
  }

  void raw_delete(void* p) override { free_raw(p); }

  void init(int device_count) override {
    std::lock_guard lock(init_mutex_);
    if (initialized_.load()) return;
    devices_.clear();
    for (int i = 0; i < device_count; ++i) devices_.push_back(std::make_unique<device_state>());
    initialized_.store(true);
  }

  double getMemoryFraction(DeviceIndex device) override {
    device_state& d = slot(device);
    std::lock_guard lock(d.m);
    return d.fraction;
  }

  void setMemoryFraction(double fraction, DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "gmlake: invalid fraction ", fraction, ", must be in [0, 1]");
    device_state& d = slot(device);
    std::lock_guard lock(d.m);
    d.fraction = fraction;  // applied at each allocation (apply_fraction)
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(DeviceIndex) override { return {}; }

  void enable(bool) override {}
  bool isEnabled() const override { return true; }

  void cacheInfo(DeviceIndex device, std::size_t* largest) override {
    device_state& d = slot(device);
    if (*largest == 0) *largest = device_memory(device).first;  // as PyTorch's own: a first guess, the free memory
    std::lock_guard lock(d.m);
    if (!d.main) return;
    const gmlake::memory_breakdown m = d.main->breakdown();
    // The largest request served without new memory is at most every free whole chunk stitched.
    *largest = std::max<std::size_t>(*largest, m.large_free_whole);
  }

  void* getBaseAllocation(void* p, std::size_t* size) override {
    const DeviceIndex dev = c10::cuda::current_device();
    (void)dev;
    block* b = live_.find(p);
    TORCH_CHECK(b != nullptr, "gmlake: getBaseAllocation: pointer not allocated here");
    if (size) *size = b->size;
    return p;  // every gmlake block is its own base: nothing is carved out of a larger allocation
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &free_raw) return;  // not ours (or empty)
    block* b = live_.find(ptr.get());
    if (b == nullptr) return;
    device_state& d = state(b->device);
    std::lock_guard lock(d.m);
    const cudaStream_t s = stream.stream();
    if (s == b->stream || std::find(b->uses.begin(), b->uses.end(), s) != b->uses.end()) return;
    b->uses.push_back(s);
  }

  cca::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override;

  void beginAllocateToPool(DeviceIndex device, MempoolId_t id, std::function<bool(cudaStream_t)> filter) override {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    pool& p = pool_of(d, id);
    ++p.use_count;
    d.captures.emplace_back(id, std::move(filter));
    d.main->set_capture_mode(true);
  }

  void endAllocateToPool(DeviceIndex device, MempoolId_t id) override {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    auto it = std::find_if(d.captures.begin(), d.captures.end(), [&](const auto& c) { return c.first == id; });
    TORCH_CHECK(it != d.captures.end(), "gmlake: endAllocateToPool: no allocation to this pool is under way");
    d.captures.erase(it);
    if (d.captures.empty()) d.main->set_capture_mode(false);
  }

  void releasePool(DeviceIndex device, MempoolId_t id) override {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    auto it = d.pools.find(id);
    TORCH_CHECK(it != d.pools.end(), "gmlake: releasePool: unknown pool");
    TORCH_CHECK(it->second->use_count > 0, "gmlake: releasePool: pool already released");
    --it->second->use_count;  // its memory goes back at empty_cache or when memory runs out
  }

  /// MemPool(use_on_oom=True): a request the device's allocator cannot serve is
  /// served from this pool's memory, as PyTorch's own allocator does.
  void setUseOnOOM(DeviceIndex device, MempoolId_t id, bool use_on_oom) override {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    auto it = d.pools.find(id);
    if (it != d.pools.end()) it->second->use_on_oom = use_on_oom;
    else if (use_on_oom) pool_of(d, id).use_on_oom = true;
  }

  /// MemPool(no_split=True): PyTorch's own allocator then never splits the pool's
  /// segments. Nothing to do here: a gmlake block is never part of a larger one
  /// handed out (getBaseAllocation is the block itself).
  void setNoSplit(DeviceIndex /*device*/, MempoolId_t /*id*/) override {}

  int getPoolUseCount(DeviceIndex device, MempoolId_t id) override {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    auto it = d.pools.find(id);
    return it == d.pools.end() ? 0 : it->second->use_count;
  }

  void createOrIncrefPool(DeviceIndex device, MempoolId_t id, std::shared_ptr<cca::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr, "gmlake: a memory pool with its own allocator is not supported");
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    ++pool_of(d, id).use_count;
  }

  bool checkPoolLiveAllocations(DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    auto it = d.pools.find(id);
    const pool* p = it == d.pools.end() ? nullptr : it->second.get();
    std::size_t n = 0;
    bool ok = true;
    live_.for_each([&](block* b) {
      if (p == nullptr || b->owner != p) return;
      ok &= expected.count(b->ptr) > 0;
      ++n;
    });
    return ok && n == expected.size();
  }

  cca::ShareableHandle shareIpcHandle(void*) override {
    TORCH_CHECK(false, "gmlake: CUDA IPC of tensors is not supported");
  }
  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    TORCH_CHECK(false, "gmlake: CUDA IPC of tensors is not supported");
  }

  bool isHistoryEnabled() override { return record_.load(); }

  // Locks: a device's m, then history_mutex_ (record_trace); never the other way
  // round, so recordHistory lets go of history_mutex_ before it touches the devices.

  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, std::size_t max_entries,
                     cca::RecordContext when, bool clear, const std::vector<std::string>& skip_actions) override {
    const unsigned skip = skipped_actions(skip_actions);
    {
      std::lock_guard lock(history_mutex_);
      skip_ = skip;
      context_recorder_ = context_recorder;
      record_when_ = enabled ? when : cca::RecordContext::NEVER;
      max_entries_ = std::max<std::size_t>(max_entries, 1);  // each device's ring follows at its next entry
      record_.store(enabled);
    }
    if (clear || !enabled)  // as PyTorch's own: turning history off clears it
      for_each_device([&](device_state& d) {
        std::lock_guard dl(d.m);
        d.trace.clear();
        d.trace_next = 0;
      });
  }

  /// The history's actions to leave out, as bits of TraceEntry::Action, from the names
  /// PyTorch's _record_memory_history(skip_actions=...) takes. gmlake records no segment
  /// or snapshot entries, so those names are accepted and change nothing.
  static unsigned skipped_actions(const std::vector<std::string>& names) {
    static constexpr std::pair<const char*, cca::TraceEntry::Action> recorded[] = {
        {"alloc", cca::TraceEntry::ALLOC},
        {"free_requested", cca::TraceEntry::FREE_REQUESTED},
        {"free_completed", cca::TraceEntry::FREE_COMPLETED},
        {"oom", cca::TraceEntry::OOM}};
    static constexpr const char* never_recorded[] = {"segment_alloc", "segment_free", "segment_map",
                                                     "segment_unmap", "snapshot", "user_defined"};
    unsigned bits = 0;
    for (const std::string& name : names) {
      auto r = std::find_if(std::begin(recorded), std::end(recorded), [&](const auto& a) { return name == a.first; });
      if (r != std::end(recorded)) {
        bits |= 1u << static_cast<unsigned>(r->second);
        continue;
      }
      TORCH_CHECK(std::find(std::begin(never_recorded), std::end(never_recorded), name) != std::end(never_recorded),
                  "gmlake: unknown trace action '", name,
                  "' in skip_actions (alloc, free_requested, free_completed, oom, segment_alloc, segment_free, "
                  "segment_map, segment_unmap, snapshot, user_defined)");
    }
    return bits;
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard lock(history_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    std::lock_guard lock(history_mutex_);
    auto more = std::make_shared<std::vector<cca::AllocatorTraceTracker>>(*trackers_);
    more->push_back(std::move(tracker));
    trackers_ = std::move(more);  // copy on write: record_trace calls its copy without the lock
    tracked_.store(true);
  }

  void enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access) override {
    // VMM memory is made accessible per device through cuMemSetAccess; other devices
    // copy through cudaMemcpyPeerAsync (memcpyAsync below).
    (void)dev;
    (void)dev_to_access;
  }

  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, std::size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dst_device == src_device)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  /// CUDA graph trees (torch.compile mode="reduce-overhead") checkpoint a pool after
  /// each recording: the pool's live blocks.
  std::shared_ptr<cca::AllocatorState> getCheckpointState(DeviceIndex device, MempoolId_t id) override {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    auto st = std::make_shared<pool_state>();
    st->device = device;
    st->id = id;
    auto it = d.pools.find(id);
    if (it != d.pools.end()) {
      const pool* p = it->second.get();
      live_.for_each([&](block* b) {
        if (b->owner == p) st->blocks.emplace_back(b->ptr, b->size);
      });
    }
    return st;
  }

  /// Sets a pool back to a checkpoint: blocks live now and not in it are freed; the
  /// checkpoint's blocks are handed out again at their addresses, with new data
  /// pointers. gmlake keeps a block that is live in both where it is (PyTorch's own
  /// allocator frees and re-creates it at the same address: the same result).
  cca::CheckpointDelta setCheckpointPoolState(DeviceIndex device, std::shared_ptr<cca::AllocatorState> s) override {
    auto* st = dynamic_cast<pool_state*>(s.get());
    TORCH_CHECK(st != nullptr, "gmlake: setCheckpointPoolState: not a gmlake checkpoint");
    device_state& d = state(device);
    std::unique_lock lock(d.m);
    auto it = d.pools.find(st->id);
    TORCH_CHECK(it != d.pools.end(), "gmlake: setCheckpointPoolState: unknown pool");
    pool* p = it->second.get();
    std::unordered_map<void*, std::size_t> keep(st->blocks.begin(), st->blocks.end());
    std::vector<block*> stale;
    std::size_t kept = 0;
    live_.for_each([&](block* b) {
      if (b->owner != p) return;
      auto k = keep.find(b->ptr);
      if (k != keep.end() && k->second == b->size) ++kept;
      else stale.push_back(b);
    });
    TORCH_CHECK(kept == st->blocks.size(),
                "gmlake: setCheckpointPoolState: a block of the checkpoint was freed since; gmlake cannot "
                "hand out memory at a given address (", st->blocks.size() - kept, " of ", st->blocks.size(),
                " blocks missing)");
    cca::CheckpointDelta delta;
    for (block* b : stale) {
      delta.ptrs_freed.push_back(b->ptr);
      live_.take(b->ptr);
      d.stats.on_free(b->size);
      give_back(d, b);
    }
    for (auto& [ptr, size] : st->blocks) {
      delta.ptrs_freed.push_back(ptr);
      delta.dataptrs_allocd.emplace_back(ptr, ptr, &free_raw, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  std::string name() override { return "gmlake"; }

  // ---------------------------------------------------------------- gmlake's own

  /// gmlake's statistics for device, summed over its allocator and graph pools.
  gmlake::statistics gmlake_stats(DeviceIndex device) {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    return totals(d);
  }

  gmlake::memory_breakdown breakdown(DeviceIndex device) {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    return d.main->breakdown();
  }

  std::size_t pool_count(DeviceIndex device) {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    return d.pools.size();
  }

  std::size_t chunk_size(DeviceIndex device) {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    return d.main->chunk_size();
  }

  template <class F>
  void visit_segments(DeviceIndex device, F f) {
    device_state& d = state(device);
    std::lock_guard lock(d.m);
    d.main->visit_layout(f, [](const gmlake::layout_piece&) {});
    for (auto& [id, p] : d.pools) p->alloc->visit_layout(f, [](const gmlake::layout_piece&) {});
  }

  static native_allocator& instance() {
    static native_allocator* a = new native_allocator;  // never destroyed: tensors outlive static destructors
    return *a;
  }

  /// The overrides of gmlake's rules every allocator here (devices and graph pools)
  /// is made with: set by install() before CUDA is initialised, fixed after.
  static gmlake::settings& settings() {
    static gmlake::settings s;
    return s;
  }

 private:
  /// The device's state, its allocator not necessarily made (d.main may be null).
  device_state& slot(DeviceIndex device) {
    if (!initialized_.load()) init(c10::cuda::device_count());
    TORCH_CHECK(device >= 0 && static_cast<std::size_t>(device) < devices_.size(), "gmlake: no CUDA device ",
                static_cast<int>(device));
    return *devices_[device];
  }

  /// The device's state with its allocator, made on first use.
  device_state& state(DeviceIndex device) {
    device_state& d = slot(device);
    if (!d.made.load(std::memory_order_acquire)) {
      std::lock_guard lock(d.m);
      if (!d.main) d.main = make_core(device, false);
      d.made.store(true, std::memory_order_release);
    }
    return d;
  }

  /// The devices gmlake has an allocator on (none is made here: that would open a
  /// context on every device).
  template <class F>
  void for_each_device(F f) {
    if (!initialized_.load()) return;
    for (auto& d : devices_)
      if (d->made.load(std::memory_order_acquire)) f(*d);
  }

  static std::unique_ptr<core> make_core(DeviceIndex device, bool capture) {
    gmlake::options opt = settings().applied(gmlake::options{});
    opt.on_misuse = &on_misuse;
    if (capture) opt.va_factor = 1;  // a graph pool reserves less address space
    auto a = std::make_unique<core>(gmlake::backend::cuda_vmm(device), opt,
                                    settings().applied(gmlake::policy::best_fit_pieces{}));
    if (capture) a->set_capture_mode(true);
    return a;
  }

  pool& pool_of(device_state& d, MempoolId_t id) {
    auto& p = d.pools[id];
    if (!p) {
      p = std::make_unique<pool>();
      p->id = id;
      // Same device; the memory fraction caps it together with the device's allocator (apply_fraction).
      p->alloc = make_core(static_cast<DeviceIndex>(d.main->backend().device()), true);
    }
    return *p;
  }

  /// The device's statistics: its allocator's, its graph pools' and those of the
  /// pools destroyed so far (their counts; nothing current), summed.
  static gmlake::statistics totals(device_state& d) {
    gmlake::statistics t = d.main ? d.main->stats() : gmlake::statistics{};
    add(t, d.retired);
    for (auto& [id, p] : d.pools) add(t, p->alloc->stats());
    return t;
  }

  static void add(gmlake::statistics& t, const gmlake::statistics& s) {
    for (auto [to, from] : {std::pair{&t.requested_bytes, &s.requested_bytes}, {&t.active_bytes, &s.active_bytes},
                            {&t.reserved_bytes, &s.reserved_bytes}, {&t.mapped_bytes, &s.mapped_bytes},
                            {&t.chunks, &s.chunks}, {&t.stitched_blocks, &s.stitched_blocks},
                            {&t.allocations, &s.allocations}, {&t.quarantined_bytes, &s.quarantined_bytes},
                            {&t.quarantined_stitches, &s.quarantined_stitches}}) {
      to->current += from->current;
      to->peak += from->peak;  // a bound: pools' peaks need not coincide
      to->allocated += from->allocated;
      to->freed += from->freed;
    }
    for (std::size_t i = 0; i < t.fit.size(); ++i) t.fit[i] += s.fit[i];
    for (std::size_t i = 0; i < t.calls.size(); ++i) t.calls[i] += s.calls[i];
    for (std::size_t i = 0; i < t.call_failures.size(); ++i) t.call_failures[i] += s.call_failures[i];
    t.cached_stitch_hits += s.cached_stitch_hits;
    t.cached_stitch_repairs += s.cached_stitch_repairs;
    t.cached_stitch_appends += s.cached_stitch_appends;
    t.failed_cleanups += s.failed_cleanups;
    t.evictions += s.evictions;
    t.stream_waits += s.stream_waits;
    t.num_alloc_retries += s.num_alloc_retries;
    t.num_ooms += s.num_ooms;
    t.invalid_frees += s.invalid_frees;
    t.lent_bytes += s.lent_bytes;
    t.borrowed_bytes += s.borrowed_bytes;
  }

  /// Keeps the counts and peaks of a graph pool about to be destroyed (its memory
  /// released already, or by its destructor: counted as freed now).
  static void retire(device_state& d, core& a) {
    gmlake::statistics s = a.stats();
    for (gmlake::stat* g : gauges(s)) {
      g->freed += g->current;
      g->current = 0;
    }
    add(d.retired, s);
  }

  static std::array<gmlake::stat*, 9> gauges(gmlake::statistics& s) {
    return {&s.requested_bytes, &s.active_bytes,   &s.reserved_bytes,    &s.mapped_bytes,        &s.chunks,
            &s.stitched_blocks, &s.allocations,    &s.quarantined_bytes, &s.quarantined_stitches};
  }

  static accumulated_base accumulated(const gmlake::statistics& g) {
    auto i = [](auto v) { return static_cast<std::int64_t>(v); };
    return {i(g.calls[static_cast<std::size_t>(gmlake::call::create)]),
            i(g.calls[static_cast<std::size_t>(gmlake::call::release)]),
            i(g.num_alloc_retries),
            i(g.stream_waits),
            i(g.reserved_bytes.allocated),
            i(g.reserved_bytes.freed),
            i(g.chunks.allocated),
            i(g.chunks.freed)};
  }

  /// A counter since the last reset.
  static std::int64_t since(std::int64_t now, std::int64_t base) { return now - base; }

  /// The bytes the memory fraction allows the device, its allocator and graph pools
  /// together (as PyTorch's own allocator counts them); nullopt: no cap.
  static std::optional<std::size_t> allowed(const device_state& d) {
    if (d.fraction >= 1.0 || !d.main) return std::nullopt;
    const gmlake::backend::cuda_vmm& be = d.main->backend();
    const std::size_t g = be.granularity();
    return static_cast<std::size_t>(d.fraction * static_cast<double>(be.capacity())) / g * g;
  }

  /// Limits `a` to what the memory fraction leaves beside the memory of the device's
  /// other allocators (a limit of 0 would mean none: 1 byte lets nothing be made).
  static void apply_fraction(device_state& d, core& a) {
    const std::optional<std::size_t> cap = allowed(d);
    if (!cap) {
      if (d.capped) {  // the fraction went back to 1: lift the limits, once
        if (d.main) d.main->backend().set_limit(0);
        for (auto& [id, p] : d.pools) p->alloc->backend().set_limit(0);
        d.capped = false;
      }
      return;
    }
    d.capped = true;
    std::size_t others = 0;
    auto add = [&](core& c) {
      if (&c != &a) others += c.backend().created_bytes();
    };
    add(*d.main);
    for (auto& [id, p] : d.pools) add(*p->alloc);
    a.backend().set_limit(std::max<std::size_t>(*cap > others ? *cap - others : 0, 1));
  }

  static void copy(c10::CachingAllocator::Stat& to, const gmlake::stat& from) {
    to.current = from.current;
    to.peak = from.peak;
    to.allocated = from.allocated;
    to.freed = from.freed;
  }

  /// The reserved bytes and chunks by arena (small pool: the small arena), their
  /// peaks kept here over the samples.
  static void sample_reserved(device_state& d) {
    std::int64_t bytes[2] = {0, 0}, chunks[2] = {0, 0};
    auto add = [&](const core& a) {
      a.visit_layout(
          [&](const gmlake::layout_segment& g) {
            if (g.kind == gmlake::layout_segment::stitched) return;  // maps chunks counted already
            const int k = g.kind == gmlake::layout_segment::small_chunk ? 0 : 1;
            bytes[k] += static_cast<std::int64_t>(g.bytes);
            ++chunks[k];
          },
          [](const gmlake::layout_piece&) {});
    };
    if (d.main) add(*d.main);
    for (auto& [id, p] : d.pools) add(*p->alloc);
    auto set = [](c10::CachingAllocator::Stat& s, std::int64_t v) {
      if (v > s.current) s.allocated += v - s.current;
      else s.freed += s.current - v;
      s.current = v;
      s.peak = std::max(s.peak, v);
    };
    set(d.reserved_small, bytes[0]);
    set(d.reserved_large, bytes[1]);
    set(d.segments_small, chunks[0]);
    set(d.segments_large, chunks[1]);
  }

  // ---------------------------------------------------------------- allocate / free

  block* make_block(DeviceIndex dev, std::size_t n, cudaStream_t s) {
    std::shared_ptr<c10::GatheredContext> ctx;
    if (record_.load()) {
      cca::CreateContextFn recorder = nullptr;
      {
        std::lock_guard h(history_mutex_);
        if (record_when_ != cca::RecordContext::NEVER) recorder = context_recorder_;
      }
      if (recorder) ctx = recorder();  // outside every lock: it gathers Python frames
    }
    device_state& d = state(dev);
    std::unique_lock lock(d.m);
    const bool capturing = !d.captures.empty();
    if (!capturing) settle_pending(d, false);
    // Driver calls (cuMemCreate, cuMemMap) are allowed during a capture only in relaxed mode.
    std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed;
    if (capturing) relaxed.emplace(cudaStreamCaptureModeRelaxed);
    pool* p = nullptr;
    for (auto& [id, filter] : d.captures)
      if (filter(s)) {
        p = &pool_of(d, id);
        break;
      }
    core& a = p ? *p->alloc : *d.main;
    apply_fraction(d, a);
    void* ptr = a.try_allocate(n, s);
    const bool retry = ptr == nullptr && !capturing;
    if (retry) {
      // Last resort before out-of-memory: wait for every deferred free, release the
      // memory of released graph pools and the cache, then try once more (gmlake
      // counted the retry already: its own release and retry before failing).
      settle_pending(d, true);
      release_retired_pools(d);
      d.main->release_cached();
      apply_fraction(d, a);
      ptr = a.try_allocate(n, s);
    }
    for (auto it = d.pools.begin(); ptr == nullptr && p == nullptr && it != d.pools.end(); ++it)
      if (it->second->use_on_oom) {  // the memory of a pool made to serve when the device's cannot
        apply_fraction(d, *it->second->alloc);
        if ((ptr = it->second->alloc->try_allocate(n, s)) != nullptr) p = it->second.get();
      }
    if (ptr == nullptr) {
      ++d.stats.num_ooms;
      if (retry) --d.stats.num_alloc_retries;  // gmlake counted both attempts' retries: one request
      const auto [free_b, total_b] = device_memory(dev);
      std::string msg = oom_message(d, dev, n, a, free_b, total_b);
      // As PyTorch's own allocator: the observers get the request, and the bytes the
      // fraction allows as the device's total when one is set.
      const std::size_t shown_total = allowed(d).value_or(total_b);
      // An OOM entry's address is the device's free bytes, as PyTorch's own writes it.
      record_trace(d, cca::TraceEntry::OOM, dev, free_b, n, s, p ? p->id : MempoolId_t{0, 0}, std::move(ctx));
      lock.unlock();
      notify_oom(dev, n, shown_total, free_b);
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    }
    auto* b = new block{ptr, n, s, dev, p, {}, std::move(ctx)};
    if (p) ++p->live;
    live_.insert(b);
    d.stats.on_alloc(n);
    record_trace(d, cca::TraceEntry::ALLOC, dev, reinterpret_cast<std::uintptr_t>(ptr), n, s,
                 p ? p->id : MempoolId_t{0, 0}, b->context);
    return b;
  }

  static void free_raw(void* p) {
    if (p == nullptr) return;
    native_allocator& self = instance();
    block* b = self.live_.take(p);
    if (b == nullptr) {
      TORCH_WARN("gmlake: free of a pointer not allocated here (ignored): ", p);
      return;
    }
    self.free(b);
  }

  void free(block* b) {
    device_state& d = *devices_[b->device];
    std::lock_guard lock(d.m);
    d.stats.on_free(b->size);
    record_trace(d, cca::TraceEntry::FREE_REQUESTED, b->device, reinterpret_cast<std::uintptr_t>(b->ptr), b->size,
                 b->stream, b->owner ? b->owner->id : MempoolId_t{0, 0}, nullptr);
    if (b->uses.empty()) return give_back(d, b);
    d.deferred.push_back(b);
    if (d.captures.empty()) record_deferred(d);  // events cannot be recorded on streams being captured
  }

  /// Moves each deferred free to the pending ones, recording its events. A block is
  /// in exactly one of the two lists, also when a CUDA call fails (the error is
  /// raised; the block stays deferred and is tried again).
  void record_deferred(device_state& d) {
    while (!d.deferred.empty()) {
      wait_on_uses(d, d.deferred.back());
      d.deferred.pop_back();
    }
  }

  /// Records an event on each stream b was used on; b goes back once all completed.
  /// Adds b to the pending frees when every event is recorded; otherwise raises,
  /// its events back among the spare ones.
  void wait_on_uses(device_state& d, block* b) {
    c10::cuda::CUDAGuard guard(b->device);
    pending_free f{b, {}};
    f.events.reserve(b->uses.size());
    try {
      for (cudaStream_t s : b->uses) {
        cudaEvent_t e = nullptr;
        if (!d.spare_events.empty()) {
          e = d.spare_events.back();
          d.spare_events.pop_back();
        } else {
          C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        }
        f.events.push_back(e);  // room reserved: cannot throw
        C10_CUDA_CHECK(cudaEventRecord(e, s));
      }
      d.pending.push_back(std::move(f));
    } catch (...) {
      d.spare_events.insert(d.spare_events.end(), f.events.begin(), f.events.end());
      throw;
    }
  }

  /// Frees whose events completed go back to gmlake (all of them, waiting, if `wait`).
  void settle_pending(device_state& d, bool wait) {
    record_deferred(d);
    while (!d.pending.empty()) {
      pending_free& f = d.pending.front();
      bool done = true;
      for (cudaEvent_t e : f.events) {
        if (wait) {
          C10_CUDA_CHECK(cudaEventSynchronize(e));
          continue;
        }
        const cudaError_t r = cudaEventQuery(e);
        if (r == cudaErrorNotReady) {
          (void)cudaGetLastError();
          done = false;
          break;
        }
        C10_CUDA_CHECK(r);
      }
      if (!done) break;  // in order: a later free's events were recorded later
      for (cudaEvent_t e : f.events) d.spare_events.push_back(e);
      block* b = f.b;
      d.pending.pop_front();
      give_back(d, b);
    }
    if (wait) ++d.stats.num_sync_all_streams;
  }

  void give_back(device_state& d, block* b) {
    core& a = b->owner ? *b->owner->alloc : *d.main;
    a.deallocate(b->ptr, b->size, b->stream);
    record_trace(d, cca::TraceEntry::FREE_COMPLETED, b->device, reinterpret_cast<std::uintptr_t>(b->ptr), b->size,
                 b->stream, b->owner ? b->owner->id : MempoolId_t{0, 0}, nullptr);
    if (b->owner) --b->owner->live;
    delete b;
  }

  /// Destroys the graph pools no graph uses and no live block is in. The device is
  /// synchronised first: a replay may still be using their memory.
  static void release_retired_pools(device_state& d) {
    bool synced = false;
    for (auto it = d.pools.begin(); it != d.pools.end();) {
      pool& p = *it->second;
      if (p.use_count > 0 || p.live > 0) {
        ++it;
        continue;
      }
      if (!synced) {
        c10::cuda::CUDAGuard guard(static_cast<DeviceIndex>(d.main->backend().device()));
        C10_CUDA_CHECK(cudaDeviceSynchronize());
        synced = true;
      }
      p.alloc->set_capture_mode(false);
      p.alloc->release_cached();
      retire(d, *p.alloc);
      it = d.pools.erase(it);
    }
  }

  std::string oom_message(device_state& d, DeviceIndex dev, std::size_t n, core& a, std::size_t free_b,
                          std::size_t total_b) {
    const gmlake::statistics g = totals(d);
    const gmlake::memory_breakdown m = a.breakdown();
    const std::int64_t allocated = d.stats.allocated_bytes[0].current;
    const std::int64_t reserved = g.reserved_bytes.current;
    std::string msg = "CUDA out of memory (gmlake). Tried to allocate " + format_size(n) + ". GPU " +
                      std::to_string(dev) + " has a total capacity of " + format_size(total_b) + " of which " +
                      format_size(free_b) + " is free. Of the allocated memory " + format_size(allocated) +
                      " is allocated by PyTorch, and " + format_size(reserved > allocated ? reserved - allocated : 0) +
                      " is reserved by gmlake but unallocated; " + format_size(m.cached_stitch_bytes) + " is in " +
                      std::to_string(m.cached_stitches) + " cached stitched blocks and " +
                      std::to_string(g.stitched_blocks.current) + " stitched blocks are mapped.";
    if (const std::optional<std::size_t> cap = allowed(d))
      msg += " The memory fraction caps gmlake at " + format_size(*cap) + " (graph pools included).";
    return msg;
  }

  /// Calls the out-of-memory observers (without the device's lock: they may read the
  /// statistics) with the request, the device's total (or the fraction's bytes) and free bytes.
  void notify_oom(DeviceIndex dev, std::size_t n, std::size_t total, std::size_t free_b) {
    std::vector<cca::OutOfMemoryObserver> obs;
    {
      std::lock_guard lock(history_mutex_);
      obs = oom_observers_;
    }
    for (auto& o : obs) o(dev, n, total, free_b);
  }

  void record_trace(device_state& d, cca::TraceEntry::Action action, DeviceIndex dev, std::uintptr_t addr,
                    std::size_t n, cudaStream_t s, MempoolId_t pool_id, std::shared_ptr<c10::GatheredContext> ctx) {
    if (!record_.load() && !tracked_.load()) return;
    cca::RecordContext when;
    std::size_t max;
    bool skipped;
    std::shared_ptr<const std::vector<cca::AllocatorTraceTracker>> trackers;
    {
      std::lock_guard h(history_mutex_);  // under d.m (the lock order above)
      when = record_when_;
      max = max_entries_;
      skipped = (skip_ >> static_cast<unsigned>(action) & 1u) != 0;
      trackers = trackers_;
    }
    cca::TraceEntry e(action, dev, addr, n, s, pool_id, c10::getApproximateTime(),
                      when >= cca::RecordContext::ALLOC ? std::move(ctx) : nullptr);
    for (auto& t : *trackers) t(e);  // under d.m, as PyTorch's own calls them under its lock
    if (!record_.load() || skipped) return;  // skip_actions leave the history, not the trackers
    if (d.trace_max != max) {  // max_entries changed: the ring in time order, its newest `max` kept
      if (const std::size_t k = d.trace.size(); k > 0)
        std::rotate(d.trace.begin(), d.trace.begin() + static_cast<std::ptrdiff_t>(d.trace_next % k), d.trace.end());
      if (d.trace.size() > max) d.trace.erase(d.trace.begin(), d.trace.end() - static_cast<std::ptrdiff_t>(max));
      d.trace_next = 0;
      d.trace_max = max;
    }
    if (d.trace.size() < max) {
      d.trace.push_back(std::move(e));
    } else {
      d.trace[d.trace_next] = std::move(e);
      d.trace_next = (d.trace_next + 1) % max;
    }
  }

  friend cca::SnapshotInfo snapshot_of(native_allocator&, MempoolId_t, bool);

  std::mutex init_mutex_;
  std::atomic<bool> initialized_{false};
  std::vector<std::unique_ptr<device_state>> devices_;
  block_map live_;

  std::mutex history_mutex_;
  std::atomic<bool> record_{false};
  std::atomic<bool> tracked_{false};  // trackers_ is not empty
  // under history_mutex_:
  cca::CreateContextFn context_recorder_ = nullptr;
  cca::RecordContext record_when_ = cca::RecordContext::NEVER;
  std::size_t max_entries_ = 1;
  unsigned skip_ = 0;  // the actions the history leaves out (skipped_actions)
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::shared_ptr<const std::vector<cca::AllocatorTraceTracker>> trackers_ =
      std::make_shared<const std::vector<cca::AllocatorTraceTracker>>();
};

}  // namespace

namespace {

/// The layout as memory_viz reads it: each arena handle and each stitched block a
/// segment; in each, the live allocations, the pieces a stitched block maps (active,
/// not allocated) and the free pieces, in address order.
cca::SnapshotInfo snapshot_of(native_allocator& self, MempoolId_t only, bool include_traces) {
  cca::SnapshotInfo info;
  if (!self.initialized_.load()) return info;
  for (std::size_t dev = 0; dev < self.devices_.size(); ++dev) {
    device_state& d = *self.devices_[dev];
    std::lock_guard lock(d.m);
    if (!d.main) {
      info.device_traces.emplace_back();
      continue;
    }
    auto add_core = [&](const core& a, MempoolId_t id) {
      if (only != MempoolId_t{0, 0} && only != id) return;
      a.visit_layout(
          [&](const gmlake::layout_segment& s) {
            cca::SegmentInfo seg;
            seg.device = static_cast<DeviceIndex>(dev);
            seg.address = s.address;
            seg.total_size = s.bytes;
            seg.is_large = s.kind != gmlake::layout_segment::small_chunk;
            seg.is_expandable = false;
            seg.owner_private_pool_id = id;
            info.segments.push_back(std::move(seg));
          },
          [&](const gmlake::layout_piece& p) {
            cca::SegmentInfo& seg = info.segments.back();
            cca::BlockInfo b;
            b.size = p.bytes;
            if (p.state == gmlake::layout_piece::allocated) {
              const block* live = self.live_.find(reinterpret_cast<void*>(p.address));
              b.allocated = b.active = true;
              if (live != nullptr) {
                b.requested_size = live->size;
                b.context_when_allocated = live->context;
                seg.stream = live->stream;
              } else {
                b.requested_size = p.bytes;
              }
              seg.allocated_size += b.size;
              seg.requested_size += b.requested_size;
              seg.active_size += b.size;
            } else if (p.state == gmlake::layout_piece::mapped_by_stitch) {
              b.active = true;  // in use through a stitched block
              seg.active_size += b.size;
            }
            seg.blocks.push_back(std::move(b));
          });
    };
    add_core(*d.main, {0, 0});
    for (auto& [id, p] : d.pools) add_core(*p->alloc, id);
    std::vector<cca::TraceEntry> trace;
    if (include_traces) {
      trace.reserve(d.trace.size());
      for (std::size_t i = 0; i < d.trace.size(); ++i) trace.push_back(d.trace[(d.trace_next + i) % d.trace.size()]);
    }
    info.device_traces.push_back(std::move(trace));
  }
  return info;
}

cca::SnapshotInfo native_allocator::snapshot(MempoolId_t mempool_id, bool include_traces) {
  return snapshot_of(*this, mempool_id, include_traces);
}

/// PyTorch's CUDA allocator is swapped only before CUDA is initialised; so are
/// gmlake's settings (`conf`: "key:value,...", gmlake/settings.hpp) chosen. A `conf`
/// that is not valid raises ValueError (std::invalid_argument) and changes nothing.
void install(const std::string& conf) {
  const gmlake::settings s = gmlake::parse_settings(conf);
  native_allocator& a = native_allocator::instance();
  cca::CUDAAllocator* current = cca::allocator.load();
  if (current == &a) {
    TORCH_CHECK(!a.initialized() || s == native_allocator::settings(),
                "gmlake's settings can change only before CUDA is initialised (in force: \"",
                native_allocator::settings().str(), "\")");
    native_allocator::settings() = s;
    return;
  }
  TORCH_CHECK(!current->initialized(),
              "gmlake_torch.enable() must come before CUDA is initialised in this process "
              "(before the first CUDA tensor or torch.cuda call that touches the device)");
  native_allocator::settings() = s;
  // PyTorch's own way in (as torch.cuda.memory.change_current_allocator); the
  // allocator is a static that is never destroyed, so the shared_ptr owns nothing.
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(
      std::shared_ptr<cca::CUDAAllocator>(&a, [](cca::CUDAAllocator*) {}));
}

bool installed() { return cca::allocator.load() == &native_allocator::instance(); }

pybind11::dict stats_dict(int device) {
  native_allocator& a = native_allocator::instance();
  const gmlake::statistics s = a.gmlake_stats(static_cast<DeviceIndex>(device));
  pybind11::dict r;
  auto gauge = [&](const char* name, const gmlake::stat& g) {
    r[(std::string(name) + ".current").c_str()] = g.current;
    r[(std::string(name) + ".peak").c_str()] = g.peak;
    r[(std::string(name) + ".allocated").c_str()] = g.allocated;
    r[(std::string(name) + ".freed").c_str()] = g.freed;
  };
  gauge("gmlake.mapped_bytes", s.mapped_bytes);
  gauge("gmlake.chunks", s.chunks);
  gauge("gmlake.stitched_blocks", s.stitched_blocks);
  static constexpr const char* fits[] = {"s1_exact", "s2_split", "s3_stitch", "s4_shortfall", "s5_oom"};
  for (std::size_t i = 0; i < gmlake::fit_state_count; ++i) r[(std::string("gmlake.fit.") + fits[i]).c_str()] = s.fit[i];
  for (std::size_t i = 0; i < gmlake::call_count; ++i)
    r[(std::string("gmlake.driver_calls.") + gmlake::call_names[i]).c_str()] = s.calls[i];
  r["gmlake.cached_stitch_hits"] = s.cached_stitch_hits;
  r["gmlake.evictions"] = s.evictions;
  r["gmlake.stream_waits"] = s.stream_waits;
  r["gmlake.invalid_frees"] = s.invalid_frees;
  r["gmlake.lent_bytes"] = s.lent_bytes;
  r["gmlake.borrowed_bytes"] = s.borrowed_bytes;
  r["gmlake.chunk_bytes"] = a.chunk_size(static_cast<DeviceIndex>(device));
  r["gmlake.graph_pools"] = a.pool_count(static_cast<DeviceIndex>(device));
  const gmlake::memory_breakdown m = a.breakdown(static_cast<DeviceIndex>(device));
  r["gmlake.breakdown.small_reserved"] = m.small_reserved;
  r["gmlake.breakdown.small_free"] = m.small_free;
  r["gmlake.breakdown.large_reserved"] = m.large_reserved;
  r["gmlake.breakdown.large_free_whole"] = m.large_free_whole;
  r["gmlake.breakdown.large_free_partial"] = m.large_free_partial;
  r["gmlake.breakdown.free_pending"] = m.free_pending;
  r["gmlake.breakdown.cached_stitches"] = m.cached_stitches;
  r["gmlake.breakdown.cached_stitch_bytes"] = m.cached_stitch_bytes;
  return r;
}

/// Segment address -> "small", "large" or "stitched", for the layout picture.
pybind11::dict segment_kinds(int device) {
  pybind11::dict r;
  native_allocator::instance().visit_segments(static_cast<DeviceIndex>(device), [&](const gmlake::layout_segment& s) {
    static constexpr const char* names[] = {"small", "large", "stitched"};
    r[pybind11::int_(s.address)] = names[static_cast<int>(s.kind)];
  });
  return r;
}

}  // namespace

PYBIND11_MODULE(_gmlake_torch, m) {
  m.doc() = "gmlake as PyTorch's CUDA allocator (c10 CUDAAllocator); use through gmlake_torch";
  m.def("install", &install, pybind11::arg("conf") = "",
        "Makes gmlake PyTorch's CUDA allocator with the settings conf (before CUDA is initialised).");
  m.def("settings", [] { return native_allocator::settings().str(); }, "The settings in force (\"\": none).");
  m.def("installed", &installed, "Whether gmlake is PyTorch's CUDA allocator.");
  m.def("segment_kinds", &segment_kinds, pybind11::arg("device"),
        "Address of each segment of torch.cuda.memory._snapshot() -> small, large or stitched.");
  m.def("stats", &stats_dict, pybind11::arg("device"), "gmlake's own statistics for a device (extra keys).");
}
