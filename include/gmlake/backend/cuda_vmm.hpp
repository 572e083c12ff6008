// gmlake/backend/cuda_vmm.hpp - the PhysicalBackend of real GPUs: the CUDA driver's
// virtual memory management API (cuMemCreate, cuMemMap, ...).
//
// What holds for all of it:
//  - the only gmlake header that includes <cuda.h>. The driver (libcuda.so.1) is
//    loaded lazily with dlopen on first use and its entry points are found with
//    cuGetProcAddress, so nothing links against libcuda: a program that includes
//    this header starts on a machine without a GPU, and `available()` says false;
//  - one backend serves one device: chunks are created on it, access is granted to
//    it alone; memory of device N is never mapped for device M;
//  - every concept call is `noexcept` and reports failure by value:
//    CUDA_ERROR_OUT_OF_MEMORY (and the creation limit) -> errc::out_of_memory,
//    a bad argument caught here -> errc::invalid, any other driver error ->
//    errc::driver, with the driver's name and message kept for `failure()`;
//  - calls run with the device's primary context current (pushed only when the
//    calling thread has another one), the context the CUDA runtime and PyTorch use;
//  - events come from a pool (created without timing) and go back to it;
//  - not thread-safe: the allocator calls its backend under its own lock.
#pragma once

#if !defined(__linux__)
#  error "gmlake/backend/cuda_vmm.hpp loads libcuda.so.1 with dlopen (Linux)"
#endif

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../errors.hpp"

namespace gmlake::backend {

namespace cuda_detail {

// Every driver function gmlake calls. The names go through <cuda.h>'s macros
// (cuEventDestroy is cuEventDestroy_v2, ...), and cuGetProcAddress with the
// header's CUDA_VERSION returns the matching ABI version of each.
#define GMLAKE_CUDA_DRIVER_FUNCTIONS(X)                                                  \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute) \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)           \
  X(cuCtxGetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                               \
  X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree)             \
  X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)              \
  X(cuMemGetInfo) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery)                       \
  X(cuEventSynchronize) X(cuEventDestroy) X(cuGetErrorName) X(cuGetErrorString)

/// The driver, loaded once per process. `ok` false: `why` says what is missing.
struct driver {
#define GMLAKE_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  GMLAKE_CUDA_DRIVER_FUNCTIONS(GMLAKE_CUDA_MEMBER)
#undef GMLAKE_CUDA_MEMBER
  bool ok = false;
  std::string why;

  /// The process-wide instance (loaded on the first call; thread-safe).
  static const driver& get() noexcept {
    static const driver d = load();
    return d;
  }

 private:
  static driver load() noexcept {
    driver d;
    try {
      void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        const char* e = ::dlerror();
        d.why = std::string("libcuda.so.1 not found (no NVIDIA driver): ") + (e ? e : "");
        return d;
      }
      // Kept loaded for the life of the process: allocators may outlive main().
      using get_proc_t = decltype(&::cuGetProcAddress);
      auto get_proc = reinterpret_cast<get_proc_t>(::dlsym(lib, "cuGetProcAddress_v2"));
      if (get_proc == nullptr) {
        d.why = "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)";
        return d;
      }
      bool all = true;
#define GMLAKE_CUDA_LOOKUP(name)                                                            \
  {                                                                                         \
    void* fn = nullptr;                                                                     \
    CUdriverProcAddressQueryResult found{};                                                 \
    if (get_proc(#name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || \
        fn == nullptr) {                                                                    \
      d.why += (all ? "driver lacks " : ", ") + std::string(#name);                         \
      all = false;                                                                          \
    }                                                                                       \
    d.name = reinterpret_cast<decltype(d.name)>(fn);                                        \
  }
      GMLAKE_CUDA_DRIVER_FUNCTIONS(GMLAKE_CUDA_LOOKUP)
#undef GMLAKE_CUDA_LOOKUP
      if (!all) return d;
      if (const CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
        d.why = "cuInit failed: " + d.describe(r);
        return d;
      }
      d.ok = true;
    } catch (...) {
      d.ok = false;
      d.why = "out of host memory while loading the CUDA driver";
    }
    return d;
  }

 public:
  /// "CUDA_ERROR_X (message)" for a result code.
  [[nodiscard]] std::string describe(CUresult r) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (cuGetErrorName) (void)cuGetErrorName(r, &name);
    if (cuGetErrorString) (void)cuGetErrorString(r, &text);
    std::string s = name ? name : "CUresult " + std::to_string(static_cast<int>(r));
    if (text) s += std::string(" (") + text + ")";
    return s;
  }
};

#undef GMLAKE_CUDA_DRIVER_FUNCTIONS

} // namespace cuda_detail

/// Physical memory of one CUDA device through the VMM driver API. Non-copyable,
/// cheaply movable; a moved-from object may only be destroyed or assigned to.
class cuda_vmm {
 public:
  /// A physical handle (cuMemCreate) and its size.
  struct chunk_type {
    CUmemGenericAllocationHandle handle = 0;
    std::size_t size = 0;
    friend bool operator==(const chunk_type&, const chunk_type&) = default;
  };
  /// A CUDA stream; the default (nullptr) is the legacy default stream.
  using stream_type = CUstream;
  using event_type = CUevent;

  /// @brief Whether the driver loads and at least one device is there (never throws).
  [[nodiscard]] static bool available() noexcept { return device_count() > 0; }

  /// @brief Devices the driver sees; 0 without a driver.
  [[nodiscard]] static int device_count() noexcept {
    const auto& d = cuda_detail::driver::get();
    int n = 0;
    if (!d.ok || d.cuDeviceGetCount(&n) != CUDA_SUCCESS) return 0;
    return n;
  }

  /// @brief Why available() is false ("" when it is true).
  [[nodiscard]] static std::string unavailable_reason() {
    const auto& d = cuda_detail::driver::get();
    if (!d.ok) return d.why;
    return device_count() > 0 ? std::string() : std::string("no CUDA device");
  }

  /// @brief Opens `device` (retains its primary context) and queries its granularity.
  /// @param device CUDA device ordinal.
  /// @param capacity physical bytes the allocator may plan for (sizes its address
  ///        space); 0: the device's total memory. Rounded up to the granularity.
  /// @throws backend_error with the driver's message when the driver is missing, the
  ///         device does not exist or does not support virtual memory management.
  explicit cuda_vmm(int device = 0, std::size_t capacity = 0) : s_(std::make_unique<state>()) {
    const auto& d = api();
    if (!d.ok) throw backend_error("gmlake::cuda_vmm: " + d.why);
    s_->device = device;
    check(d.cuDeviceGet(&s_->dev, device), "cuDeviceGet");
    int vmm = 0;
    check(d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, s_->dev),
          "cuDeviceGetAttribute");
    if (vmm == 0)
      throw backend_error("gmlake::cuda_vmm: device " + std::to_string(device) +
                          " does not support virtual memory management");
    CUmemAllocationProp prop = chunk_properties(device);
    std::size_t g = 0;
    check(d.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          "cuMemGetAllocationGranularity");
    if (g == 0) throw backend_error("gmlake::cuda_vmm: the driver reported granularity 0");
    s_->granularity = g;
    std::size_t total = 0;
    check(d.cuDeviceTotalMem(&total, s_->dev), "cuDeviceTotalMem");
    s_->capacity = round_up(capacity ? capacity : total, g);
    s_->limit = s_->capacity;
    check(d.cuDevicePrimaryCtxRetain(&s_->context, s_->dev), "cuDevicePrimaryCtxRetain");
  }

  cuda_vmm(const cuda_vmm&) = delete;
  cuda_vmm& operator=(const cuda_vmm&) = delete;
  cuda_vmm(cuda_vmm&&) noexcept = default;
  cuda_vmm& operator=(cuda_vmm&&) noexcept = default;
  ~cuda_vmm() = default;  // state's destructor destroys pooled events, drops the context

  // ------------------------------------------------------------ BackendSizes

  [[nodiscard]] std::size_t granularity() const noexcept { return s_->granularity; }
  [[nodiscard]] std::size_t capacity() const noexcept { return s_->capacity; }

  // ------------------------------------------------------------ BackendAddressSpace

  /// @brief Reserves n bytes of device address space, aligned to the granularity.
  [[nodiscard]] result<std::uintptr_t> reserve(std::size_t n) noexcept {
    if (!whole(n)) return fail(errc::invalid, "reserve: size not a positive multiple of the granularity");
    const scoped_context c(*s_);
    CUdeviceptr va = 0;
    if (const CUresult r = api().cuMemAddressReserve(&va, n, s_->granularity, 0, 0); r != CUDA_SUCCESS)
      return fail(r, "cuMemAddressReserve", n);
    return static_cast<std::uintptr_t>(va);
  }

  /// @brief Frees the reservation [va, va+n); nothing may be mapped in it.
  [[nodiscard]] errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    const scoped_context c(*s_);
    if (const CUresult r = api().cuMemAddressFree(static_cast<CUdeviceptr>(va), n); r != CUDA_SUCCESS)
      return fail(r, "cuMemAddressFree", n);
    return errc::ok;
  }

  // ------------------------------------------------------------ BackendChunks

  /// @brief Creates n bytes of physical memory on the device.
  /// @return errc::out_of_memory when the device has no room or the limit is reached.
  [[nodiscard]] result<chunk_type> create(std::size_t n) noexcept {
    if (!whole(n)) return fail(errc::invalid, "create: size not a positive multiple of the granularity");
    const std::size_t limit = s_->limit.load(std::memory_order_relaxed);
    if (n > limit || s_->created > limit - n) return errc::out_of_memory;  // not a driver failure
    const scoped_context c(*s_);
    const CUmemAllocationProp prop = chunk_properties(s_->device);
    CUmemGenericAllocationHandle h = 0;
    if (const CUresult r = api().cuMemCreate(&h, n, &prop, 0); r != CUDA_SUCCESS) return fail(r, "cuMemCreate", n);
    s_->created += n;
    return chunk_type{h, n};
  }

  /// @brief Drops the handle; the memory goes when its last mapping is unmapped.
  [[nodiscard]] errc release(chunk_type ch) noexcept {
    const scoped_context c(*s_);
    if (const CUresult r = api().cuMemRelease(ch.handle); r != CUDA_SUCCESS) return fail(r, "cuMemRelease", ch.size);
    s_->created -= ch.size;
    return errc::ok;
  }

  // ------------------------------------------------------------ BackendMapping

  /// @brief Maps all of chunk ch at [va, va+n) (n == ch.size), without access yet.
  [[nodiscard]] errc map(std::uintptr_t va, std::size_t n, chunk_type ch) noexcept {
    if (n != ch.size || !whole(n)) return fail(errc::invalid, "map: size differs from the chunk's");
    const scoped_context c(*s_);
    if (const CUresult r = api().cuMemMap(static_cast<CUdeviceptr>(va), n, 0, ch.handle, 0); r != CUDA_SUCCESS)
      return fail(r, "cuMemMap", n);
    return errc::ok;
  }

  /// @brief Makes the fully mapped range [va, va+n) readable and writable by this device.
  [[nodiscard]] errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    const scoped_context c(*s_);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = s_->device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (const CUresult r = api().cuMemSetAccess(static_cast<CUdeviceptr>(va), n, &access, 1); r != CUDA_SUCCESS)
      return fail(r, "cuMemSetAccess", n);
    return errc::ok;
  }

  /// @brief Unmaps [va, va+n). The caller has made sure no work uses it any more
  /// (the driver does not wait).
  [[nodiscard]] errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    const scoped_context c(*s_);
    if (const CUresult r = api().cuMemUnmap(static_cast<CUdeviceptr>(va), n); r != CUDA_SUCCESS)
      return fail(r, "cuMemUnmap", n);
    return errc::ok;
  }

  // ------------------------------------------------------------ BackendStreams

  /// @brief An event (from the pool) recorded on s after the work queued so far.
  [[nodiscard]] result<event_type> record(stream_type s) noexcept {
    const scoped_context c(*s_);
    CUevent e = nullptr;
    if (!s_->events.empty()) {
      e = s_->events.back();
      s_->events.pop_back();
    } else if (const CUresult r = api().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS) {
      return fail(r, "cuEventCreate", 0);
    }
    if (const CUresult r = api().cuEventRecord(e, s); r != CUDA_SUCCESS) {
      destroy(e);
      return fail(r, "cuEventRecord", 0);
    }
    return e;
  }

  /// @brief Whether e has completed.
  [[nodiscard]] result<bool> query(event_type e) noexcept {
    const scoped_context c(*s_);
    const CUresult r = api().cuEventQuery(e);
    if (r == CUDA_SUCCESS) return true;
    if (r == CUDA_ERROR_NOT_READY) return false;
    return fail(r, "cuEventQuery", 0);
  }

  /// @brief Blocks until e has completed.
  [[nodiscard]] errc synchronize(event_type e) noexcept {
    const scoped_context c(*s_);
    if (const CUresult r = api().cuEventSynchronize(e); r != CUDA_SUCCESS) return fail(r, "cuEventSynchronize", 0);
    return errc::ok;
  }

  /// @brief Gives e back to the pool.
  void destroy(event_type e) noexcept {
    if (e == nullptr) return;
    try {
      s_->events.push_back(e);
    } catch (...) {
      const scoped_context c(*s_);
      (void)api().cuEventDestroy(e);
    }
  }

  // ------------------------------------------------------------ stream identity

  /// @brief Tells apart the streams that share a handle: the per-thread default
  ///        stream (`CU_STREAM_PER_THREAD`, `cudaStreamPerThread`) is another stream on
  ///        each thread, so its key is the calling thread's (unique for the life of the
  ///        process; the allocator then records each free's event at the free, on the
  ///        freeing thread); any other handle is one stream (0).
  [[nodiscard]] static std::uint64_t stream_key(stream_type s) noexcept {
    if (s != CU_STREAM_PER_THREAD) return 0;
    static std::atomic<std::uint64_t> threads{0};
    thread_local const std::uint64_t mine = threads.fetch_add(1, std::memory_order_relaxed) + 1;
    return mine;
  }

  // ------------------------------------------------------------ outside the concept

  /// The device ordinal.
  [[nodiscard]] int device() const noexcept { return s_->device; }

  /// @brief Caps the physical bytes held at once (create fails past it with
  ///        errc::out_of_memory). At most capacity(); 0: capacity(). The one member
  ///        that may be called concurrently with the others (an atomic).
  void set_limit(std::size_t bytes) noexcept {
    s_->limit.store(bytes == 0 || bytes > s_->capacity ? s_->capacity : bytes, std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t limit() const noexcept { return s_->limit.load(std::memory_order_relaxed); }
  /// Physical bytes created and not yet released.
  [[nodiscard]] std::size_t created_bytes() const noexcept { return s_->created; }

  /// @brief The last failure that was not a lack of memory ("driver error", with the
  ///        call and the driver's message), or nullptr; cleared by clear_failure().
  [[nodiscard]] const char* failure() const noexcept { return s_->failed ? s_->message : nullptr; }
  void clear_failure() noexcept { s_->failed = false; }

  /// @brief The device's free and total bytes (cuMemGetInfo), or errc::driver.
  [[nodiscard]] errc memory_info(std::size_t& free, std::size_t& total) noexcept {
    const scoped_context c(*s_);
    if (const CUresult r = api().cuMemGetInfo(&free, &total); r != CUDA_SUCCESS) return fail(r, "cuMemGetInfo", 0);
    return errc::ok;
  }

 private:
  struct state {
    int device = 0;
    CUdevice dev = 0;
    CUcontext context = nullptr;
    std::size_t granularity = 0;
    std::size_t capacity = 0;
    std::atomic<std::size_t> limit{0};
    std::size_t created = 0;
    std::vector<CUevent> events;  ///< the pool: created, not recorded by anyone
    bool failed = false;
    char message[384] = {};

    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      const auto& d = api();
      if (context == nullptr || !d.ok) return;
      {
        const scoped_context c(*this);
        for (CUevent e : events) (void)d.cuEventDestroy(e);
      }
      (void)d.cuDevicePrimaryCtxRelease(dev);
    }
  };

  /// Makes the device's primary context current for one call, if another one is.
  class scoped_context {
   public:
    explicit scoped_context(const state& s) noexcept {
      CUcontext now = nullptr;
      if (api().cuCtxGetCurrent(&now) == CUDA_SUCCESS && now == s.context) return;
      pushed_ = api().cuCtxPushCurrent(s.context) == CUDA_SUCCESS;
    }
    scoped_context(const scoped_context&) = delete;
    scoped_context& operator=(const scoped_context&) = delete;
    ~scoped_context() {
      if (!pushed_) return;
      CUcontext popped = nullptr;
      (void)api().cuCtxPopCurrent(&popped);
    }

   private:
    bool pushed_ = false;
  };

  static const cuda_detail::driver& api() noexcept { return cuda_detail::driver::get(); }

  static CUmemAllocationProp chunk_properties(int device) noexcept {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
  }

  [[nodiscard]] bool whole(std::size_t n) const noexcept { return n != 0 && n % s_->granularity == 0; }

  void check(CUresult r, const char* what) const {
    if (r != CUDA_SUCCESS)
      throw backend_error(std::string("gmlake::cuda_vmm: ") + what + " failed on device " +
                          std::to_string(s_->device) + ": " + api().describe(r));
  }

  errc fail(errc e, const char* what) noexcept {
    s_->failed = true;
    std::snprintf(s_->message, sizeof s_->message, "gmlake::cuda_vmm: device %d: %s", s_->device, what);
    return e;
  }

  /// Turns a driver result into errc, keeping the message of a real driver failure.
  errc fail(CUresult r, const char* call, std::size_t bytes) noexcept {
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return errc::out_of_memory;
    const char* name = "?";
    const char* text = "";
    (void)api().cuGetErrorName(r, &name);
    (void)api().cuGetErrorString(r, &text);
    s_->failed = true;
    std::snprintf(s_->message, sizeof s_->message, "gmlake::cuda_vmm: %s (%zu bytes) on device %d failed: %s (%s)",
                  call, bytes, s_->device, name ? name : "?", text ? text : "");
    return errc::driver;
  }

  std::unique_ptr<state> s_;
};

static_assert(PhysicalBackend<cuda_vmm>);

} // namespace gmlake::backend
