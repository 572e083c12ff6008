// examples/torch/gmlake_torch.cpp - libgmlake_torch.so: gmlake as a PyTorch pluggable
// allocator (torch.cuda.memory.CUDAPluggableAllocator). Interface: gmlake_torch.h.
//
// One gmlake allocator per device on the CUDA VMM backend, made on first use and
// never destroyed: PyTorch frees tensors during interpreter shutdown, after static
// destructors and the CUDA runtime may have run, so the allocators (and their
// memory) stay until the process ends, as PyTorch's own do.
#include "gmlake_torch.h"

#include <gmlake/allocator.hpp>
#include <gmlake/backend/cuda_vmm.hpp>
#include <gmlake/configs.hpp>
#include <gmlake/settings.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>

namespace {

using backend = gmlake::backend::cuda_vmm;
using allocator = gmlake::allocator<backend>;

constexpr int max_devices = 64;

std::array<std::atomic<allocator*>, max_devices> allocators{};
std::mutex make_mutex;  // only for making an allocator, and for the settings
/// The rules' overrides every allocator is made with (gmlake_torch_configure, else
/// $GMLAKE_ALLOC_CONF read at the first allocator made); fixed once one exists.
/// Guarded by make_mutex.
std::optional<gmlake::settings> configured;

thread_local char last_error[512] = "";

void set_error(const char* what) noexcept {
  std::snprintf(last_error, sizeof last_error, "%s", what);
}

// Misuse (double or foreign free, wrong size) must not abort a training job:
// it is counted in the statistics (invalid_frees) and remembered here.
void on_misuse(const char* what, void* p) noexcept {
  std::snprintf(last_error, sizeof last_error, "gmlake: misuse: %s (%p)", what, p);
}

// PyTorch's pluggable-allocator path does not check for nullptr (a failed allocation
// would surface later as an illegal address), so failure is thrown by default: the
// exception (gmlake::out_of_memory, a std::bad_alloc; backend_error, a
// std::runtime_error) unwinds through PyTorch's C++ into a Python exception whose
// message names gmlake. GMLAKE_TORCH_ON_FAILURE=null returns nullptr instead.
bool throw_on_failure() noexcept {
  static const bool on = [] {
    const char* v = std::getenv("GMLAKE_TORCH_ON_FAILURE");
    return v == nullptr || std::strcmp(v, "null") != 0;
  }();
  return on;
}

int device_count() noexcept {
  static const int n = backend::device_count();  // asked once: this is on every allocation's path
  return n;
}

bool valid_device(int device) noexcept {
  if (device < 0 || device >= max_devices || device >= device_count()) {
    std::snprintf(last_error, sizeof last_error, "gmlake: no CUDA device %d", device);
    return false;
  }
  return true;
}

/// The device's allocator, made if `make` and it does not exist yet; nullptr on failure.
allocator* get(int device, bool make) noexcept {
  if (!valid_device(device)) return nullptr;
  allocator* a = allocators[device].load(std::memory_order_acquire);
  if (a != nullptr || !make) {
    if (a == nullptr) std::snprintf(last_error, sizeof last_error, "gmlake: nothing allocated on device %d", device);
    return a;
  }
  std::lock_guard lock(make_mutex);
  a = allocators[device].load(std::memory_order_relaxed);
  if (a != nullptr) return a;
  try {
    if (!configured) {
      const char* env = std::getenv("GMLAKE_ALLOC_CONF");
      configured = gmlake::parse_settings(env != nullptr ? env : "");
    }
    gmlake::options opt = configured->applied(gmlake::options{});
    opt.on_misuse = &on_misuse;
    a = new allocator(backend(device), opt, configured->applied(gmlake::policy::best_fit_pieces{}));
  } catch (const std::invalid_argument& e) {
    std::snprintf(last_error, sizeof last_error, "GMLAKE_ALLOC_CONF: %s", e.what());
    return nullptr;
  } catch (const std::exception& e) {
    set_error(e.what());
    return nullptr;
  }
  allocators[device].store(a, std::memory_order_release);
  return a;
}

template <class F>
void for_devices(int device, F f) noexcept {
  if (device >= 0) {
    if (allocator* a = get(device, false)) f(*a);
    return;
  }
  for (auto& slot : allocators)
    if (allocator* a = slot.load(std::memory_order_acquire)) f(*a);
}

} // namespace

extern "C" {

void* gmlake_torch_alloc(ssize_t size, int device, gmlake_torch_stream stream) {
  if (size < 0) {
    set_error("gmlake: negative size");
    return nullptr;
  }
  allocator* a = get(device, true);
  if (a == nullptr) return nullptr;
  try {
    return a->allocate(static_cast<std::size_t>(size), reinterpret_cast<CUstream>(stream));
  } catch (const gmlake::out_of_memory&) {
    std::snprintf(last_error, sizeof last_error, "gmlake: out of memory allocating %zd bytes on device %d", size,
                  device);
    if (throw_on_failure()) throw;
  } catch (const std::exception& e) {
    set_error(e.what());
    if (throw_on_failure()) throw;
  }
  return nullptr;
}

void gmlake_torch_free(void* ptr, ssize_t size, int device, gmlake_torch_stream stream) {
  if (ptr == nullptr) return;
  allocator* a = get(device, false);
  if (a == nullptr) return;  // nothing was ever allocated there: a foreign pointer
  a->deallocate(ptr, size > 0 ? static_cast<std::size_t>(size) : 0, reinterpret_cast<CUstream>(stream));
}

int gmlake_torch_get_stats(int device, gmlake_torch_stats* out) {
  if (out == nullptr) {
    set_error("gmlake: stats: null output");
    return -1;
  }
  allocator* a = get(device, false);
  if (a == nullptr) return -1;
  gmlake::statistics s;
  try {
    s = a->stats();
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
  gmlake_torch_stats r{};
  r.struct_size = sizeof r;
  r.requested_bytes_current = s.requested_bytes.current;
  r.requested_bytes_peak = s.requested_bytes.peak;
  r.allocated_bytes_current = s.active_bytes.current;
  r.allocated_bytes_peak = s.active_bytes.peak;
  r.reserved_bytes_current = s.reserved_bytes.current;
  r.reserved_bytes_peak = s.reserved_bytes.peak;
  r.mapped_bytes_current = s.mapped_bytes.current;
  r.mapped_bytes_peak = s.mapped_bytes.peak;
  r.allocation_current = s.allocations.current;
  r.allocation_peak = s.allocations.peak;
  r.allocation_allocated = s.allocations.allocated;
  r.allocation_freed = s.allocations.freed;
  r.segment_current = s.chunks.current;
  r.segment_peak = s.chunks.peak;
  r.stitched_blocks_current = s.stitched_blocks.current;
  r.stitched_blocks_peak = s.stitched_blocks.peak;
  r.num_alloc_retries = s.num_alloc_retries;
  r.num_ooms = s.num_ooms;
  r.cached_stitch_hits = s.cached_stitch_hits;
  r.evictions = s.evictions;
  r.invalid_frees = s.invalid_frees;
  static_assert(gmlake::fit_state_count == 5 && gmlake::call_count == 8, "gmlake_torch.h mirrors these");
  for (std::size_t i = 0; i < gmlake::fit_state_count; ++i) r.fit[i] = s.fit[i];
  for (std::size_t i = 0; i < gmlake::call_count; ++i) r.driver_calls[i] = s.calls[i];
  const std::size_t limit = a->backend().limit();
  r.limit_bytes = limit == a->backend().capacity() ? 0 : static_cast<std::int64_t>(limit);
  r.chunk_bytes = a->chunk_size();
  *out = r;
  return 0;
}

int gmlake_torch_set_limit(int device, uint64_t bytes) {
  if (device < 0) {
    const int n = device_count();
    if (n == 0) {
      set_error("gmlake: no CUDA device");
      return -1;
    }
    for (int d = 0; d < n && d < max_devices; ++d)
      if (gmlake_torch_set_limit(d, bytes) != 0) return -1;
    return 0;
  }
  allocator* a = get(device, true);
  if (a == nullptr) return -1;
  a->backend().set_limit(static_cast<std::size_t>(bytes));  // atomic: safe beside allocations
  return 0;
}

uint64_t gmlake_torch_empty_cache(int device) {
  std::uint64_t released = 0;
  for_devices(device, [&](allocator& a) { released += a.release_cached(); });
  return released;
}

void gmlake_torch_reset_peak_stats(int device) {
  for_devices(device, [](allocator& a) { a.reset_peaks(); });
}

int gmlake_torch_configure(const char* conf) {
  try {
    const gmlake::settings s = gmlake::parse_settings(conf != nullptr ? conf : "");
    std::lock_guard lock(make_mutex);
    const bool made = std::any_of(allocators.begin(), allocators.end(), [](const auto& a) { return a.load() != nullptr; });
    if (made && s != *configured) {
      const std::string now = configured->str();
      std::snprintf(last_error, sizeof last_error,
                    "gmlake: settings can change only before the first allocation (in force: \"%s\")", now.c_str());
      return -2;
    }
    configured = s;
    return 0;
  } catch (const std::invalid_argument& e) {
    set_error(e.what());
    return -1;
  } catch (const std::exception& e) {  // no memory for the message's string
    set_error(e.what());
    return -2;
  }
}

uint64_t gmlake_torch_configured(char* out, uint64_t size) {
  std::string s;
  {
    std::lock_guard lock(make_mutex);
    if (configured) s = configured->str();
  }
  if (out != nullptr && size != 0) std::snprintf(out, size, "%s", s.c_str());
  return s.size() + 1;
}

const char* gmlake_torch_last_error(void) { return last_error; }

} // extern "C"
