"""gmlake_torch - use gmlake as PyTorch's CUDA allocator.

    import gmlake_torch
    gmlake_torch.enable()              # before any CUDA work in this process
    ...                                # torch code as usual: torch.cuda.memory_stats(),
                                       # empty_cache(), record_stream, CUDA graphs, ...

Two ways in:
  native     (default when the extension _gmlake_torch is installed:
             `pip install --no-build-isolation ./examples/torch`): gmlake becomes
             PyTorch's own CUDA allocator (a c10 CUDAAllocator, examples/torch/native.cpp),
             so every torch.cuda memory call reaches it: memory_stats() and the calls
             built on it, empty_cache(), set_per_process_memory_fraction(),
             Tensor.record_stream(), CUDA graphs and their private pools,
             torch.compile(mode="reduce-overhead"), _record_memory_history() and
             _snapshot(). Out of memory raises torch.cuda.OutOfMemoryError.
  pluggable  (enable(native=False), no Python build step): libgmlake_torch.so (the C
             interface of examples/torch/gmlake_torch.h) through
             torch.cuda.memory.CUDAPluggableAllocator. PyTorch's statistics calls raise
             then and empty_cache / the memory fraction do nothing; use this module's
             functions. CUDA graphs are not supported on this path.

This module's functions (memory_stats, empty_cache, ...) work on both paths; on the
native one they are torch.cuda's, with gmlake's extra keys added to memory_stats().

The pluggable library is found at, in order: enable(lib=...), $GMLAKE_TORCH_LIB, next
to this file, ../../build/examples/torch/ relative to this file, ./build/examples/torch/.

torch is imported lazily: this module imports (and its Structure mirror can be
checked) on a machine without torch.
"""

import collections
import ctypes
import os
import threading

__all__ = [
    "enable",
    "is_enabled",
    "is_native",
    "plot_layout",
    "library_path",
    "memory_stats",
    "empty_cache",
    "reset_peak_memory_stats",
    "memory_reserved",
    "max_memory_reserved",
    "memory_allocated",
    "max_memory_allocated",
    "set_limit",
    "settings",
    "GmlakeTorchStats",
    "find_library",
]

LIB_NAME = "libgmlake_torch.so"
ALLOC_FN = "gmlake_torch_alloc"
FREE_FN = "gmlake_torch_free"

# Order of gmlake_torch_stats.driver_calls[] (gmlake_torch.h).
DRIVER_CALLS = ("reserve", "address_free", "create", "release", "map", "set_access", "unmap", "record")


class GmlakeTorchStats(ctypes.Structure):
    """Mirror of struct gmlake_torch_stats (gmlake_torch.h); field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_uint64),
        ("requested_bytes_current", ctypes.c_int64),
        ("requested_bytes_peak", ctypes.c_int64),
        ("allocated_bytes_current", ctypes.c_int64),
        ("allocated_bytes_peak", ctypes.c_int64),
        ("reserved_bytes_current", ctypes.c_int64),
        ("reserved_bytes_peak", ctypes.c_int64),
        ("mapped_bytes_current", ctypes.c_int64),
        ("mapped_bytes_peak", ctypes.c_int64),
        ("allocation_current", ctypes.c_int64),
        ("allocation_peak", ctypes.c_int64),
        ("allocation_allocated", ctypes.c_int64),
        ("allocation_freed", ctypes.c_int64),
        ("segment_current", ctypes.c_int64),
        ("segment_peak", ctypes.c_int64),
        ("stitched_blocks_current", ctypes.c_int64),
        ("stitched_blocks_peak", ctypes.c_int64),
        ("num_alloc_retries", ctypes.c_uint64),
        ("num_ooms", ctypes.c_uint64),
        ("cached_stitch_hits", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
        ("invalid_frees", ctypes.c_uint64),
        ("fit", ctypes.c_uint64 * 5),
        ("driver_calls", ctypes.c_uint64 * 8),
        ("limit_bytes", ctypes.c_int64),
        ("chunk_bytes", ctypes.c_uint64),
    ]


_lock = threading.Lock()
_lib = None          # ctypes.CDLL of the plugin, once loaded
_lib_path = None     # its absolute path
_enabled = False     # True once change_current_allocator succeeded
_allocator = None    # keeps the CUDAPluggableAllocator object alive
_abi_checked = False
_native = None       # the _gmlake_torch extension module, once enabled natively


def _candidates():
    """Where the plugin is looked for when neither lib nor $GMLAKE_TORCH_LIB names it."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, LIB_NAME),
            os.path.join(here, "..", "..", "build", "examples", "torch", LIB_NAME),
            os.path.join(os.getcwd(), "build", "examples", "torch", LIB_NAME)]


def find_library(lib=None):
    """Returns the absolute path of libgmlake_torch.so, or raises RuntimeError.

    An explicit lib (argument) or $GMLAKE_TORCH_LIB that does not exist is an
    error, not a reason to look elsewhere."""
    for label, given in (("lib", lib), ("GMLAKE_TORCH_LIB", os.environ.get("GMLAKE_TORCH_LIB"))):
        if not given:
            continue
        path = os.path.join(given, LIB_NAME) if os.path.isdir(given) else given
        if not os.path.isfile(path):
            raise RuntimeError(f"gmlake_torch: {label}={path!r} does not exist")
        return os.path.realpath(path)
    tried = _candidates()
    for c in tried:
        if os.path.isfile(c):
            return os.path.realpath(c)
    raise RuntimeError(
        "gmlake_torch: " + LIB_NAME + " not found; build it with "
        "`meson setup build && ninja -C build` (gives build/examples/torch/" + LIB_NAME + ") "
        "or set GMLAKE_TORCH_LIB. Tried: " + ", ".join(os.path.abspath(c) for c in tried))


def _load(path):
    """Loads the plugin once and declares the C signatures."""
    global _lib, _lib_path
    if _lib is not None:
        if os.path.realpath(path) != _lib_path:
            raise RuntimeError(f"gmlake_torch: already loaded {_lib_path}, cannot switch to {path}")
        return _lib
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise RuntimeError(f"gmlake_torch: cannot load {path}: {e}") from e
    try:
        lib.gmlake_torch_alloc.restype = ctypes.c_void_p
        lib.gmlake_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.gmlake_torch_free.restype = None
        lib.gmlake_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.gmlake_torch_get_stats.restype = ctypes.c_int
        lib.gmlake_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(GmlakeTorchStats)]
        lib.gmlake_torch_set_limit.restype = ctypes.c_int
        lib.gmlake_torch_set_limit.argtypes = [ctypes.c_int, ctypes.c_uint64]
        lib.gmlake_torch_empty_cache.restype = ctypes.c_uint64
        lib.gmlake_torch_empty_cache.argtypes = [ctypes.c_int]
        lib.gmlake_torch_reset_peak_stats.restype = None
        lib.gmlake_torch_reset_peak_stats.argtypes = [ctypes.c_int]
        lib.gmlake_torch_last_error.restype = ctypes.c_char_p
        lib.gmlake_torch_last_error.argtypes = []
        lib.gmlake_torch_configure.restype = ctypes.c_int
        lib.gmlake_torch_configure.argtypes = [ctypes.c_char_p]
        lib.gmlake_torch_configured.restype = ctypes.c_uint64
        lib.gmlake_torch_configured.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    except AttributeError as e:
        raise RuntimeError(f"gmlake_torch: {path} lacks a function of gmlake_torch.h: {e}") from e
    _lib = lib
    _lib_path = os.path.realpath(path)
    return lib


def _last_error():
    if _lib is None:
        return ""
    msg = _lib.gmlake_torch_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def _device_totals():
    """Total bytes of each visible device through the CUDA driver API, without
    initializing PyTorch's CUDA state (which would make the allocator swap fail).
    Returns a list (possibly empty when the driver is unavailable)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    try:
        if cuda.cuInit(0) != 0:
            return []
        n = ctypes.c_int(0)
        if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return []
        totals = []
        for i in range(n.value):
            dev = ctypes.c_int(0)
            size = ctypes.c_size_t(0)
            if cuda.cuDeviceGet(ctypes.byref(dev), i) != 0:
                return totals
            fn = getattr(cuda, "cuDeviceTotalMem_v2", None) or cuda.cuDeviceTotalMem
            if fn(ctypes.byref(size), dev) != 0:
                return totals
            totals.append(size.value)
        return totals
    except Exception:
        return []


def _limit_plan(limit):
    """[(device, bytes)] for a limit in bytes (int, or float > 1) or a fraction
    0 < f <= 1 of each device's total memory."""
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        raise TypeError(f"gmlake_torch: limit must be bytes (int) or a fraction (float), not {limit!r}")
    if isinstance(limit, float) and 0.0 < limit <= 1.0:
        totals = _device_totals()
        if not totals:
            raise RuntimeError("gmlake_torch: limit given as a fraction, but the device's total "
                               "memory could not be read through libcuda")
        return [(i, int(limit * t)) for i, t in enumerate(totals)]
    if limit < 0:
        raise ValueError(f"gmlake_torch: negative limit {limit!r}")
    return [(-1, int(limit))]


def set_limit(limit, device=-1):
    """Caps the physical bytes gmlake may hold (0: no cap); limit in bytes, or a
    float fraction 0<f<=1 of the device's total memory. device -1: all devices.
    On the native path this is torch.cuda.set_per_process_memory_fraction."""
    if _native is not None:
        import torch
        devices = range(torch.cuda.device_count()) if device == -1 else [_device_index(device)]
        for d in devices:
            total = torch.cuda.get_device_properties(d).total_memory
            if isinstance(limit, float) and 0.0 < limit <= 1.0:
                fraction = limit
            elif limit == 0:
                fraction = 1.0
            else:
                fraction = min(1.0, float(limit) / total)
            torch.cuda.set_per_process_memory_fraction(fraction, d)
        return
    lib = _lib
    if lib is None:
        raise RuntimeError("gmlake_torch: library not loaded; call enable() first")
    for dev, nbytes in _limit_plan(limit):
        d = dev if device == -1 else device
        if lib.gmlake_torch_set_limit(d, ctypes.c_uint64(nbytes)) != 0:
            raise RuntimeError(f"gmlake_torch_set_limit({d}, {nbytes}) failed: {_last_error()}")


def _import_native():
    """The _gmlake_torch extension, or None when it is not installed."""
    try:
        import _gmlake_torch
    except ImportError:
        return None
    return _gmlake_torch


def _refuse_if_initialized(torch):
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "gmlake_torch.enable() must run before any CUDA work: PyTorch's CUDA state is "
            "already initialized, so its allocator can no longer be swapped. "
            "Call enable() right after `import torch` (and before importing libraries "
            "that touch CUDA at import time).")


def _configure_plugin(conf):
    """Hands conf to the loaded plugin: ValueError when it is not valid, RuntimeError
    when the plugin's allocators were made with other settings."""
    rc = _lib.gmlake_torch_configure(conf.encode())
    if rc == -1:
        raise ValueError(_last_error())
    if rc != 0:
        raise RuntimeError(_last_error())


def enable(limit=None, lib=None, native=None, conf=None):
    """Installs gmlake as PyTorch's CUDA allocator. Call before any CUDA work.

    limit: None (no cap), bytes (int), or a fraction 0<f<=1 of the device memory.
    native: True (the _gmlake_torch extension: PyTorch's own allocator interface),
      False (libgmlake_torch.so through CUDAPluggableAllocator), None (native when
      the extension is installed, else pluggable).
    lib: path of libgmlake_torch.so (pluggable path; else $GMLAKE_TORCH_LIB, else searched).
    conf: overrides of gmlake's rules, "key:value,key:value" (docs/pytorch.md,
      "Settings"); None: $GMLAKE_ALLOC_CONF, else none, at the first call, and the
      settings in force at a later one. ValueError, with the item and the reason,
      when it is not valid; nothing is installed then.
    Returns "native" or the pluggable library's path. Calling it again is harmless
    (the limit and conf, if given, are applied again; settings may change only before
    CUDA is initialized, on the pluggable path before the first allocation). Raises
    RuntimeError with the reason when the swap is impossible (CUDA already
    initialized, library missing, ...)."""
    given = conf is not None
    if not given:
        conf = os.environ.get("GMLAKE_ALLOC_CONF", "")
    if not isinstance(conf, str):
        raise TypeError(f"gmlake_torch.enable(conf=...): expected a str, got {type(conf).__name__}")
    if "\0" in conf:
        raise ValueError("gmlake settings: a NUL character in the text")

    def apply(install):  # a conf taken from the environment says so when it is refused
        try:
            install(conf)
        except ValueError as e:
            if given:
                raise
            raise ValueError(f"GMLAKE_ALLOC_CONF: {e}") from None

    global _enabled, _allocator, _native
    with _lock:
        if _enabled:
            if native is not None and native != (_native is not None):
                raise RuntimeError("gmlake_torch: already enabled on the other path")
            if given:
                apply(_native.install if _native is not None else _configure_plugin)
            if limit is not None:
                set_limit(limit)
            return "native" if _native is not None else _lib_path
        import torch  # lazy: the module works without torch for its pure parts

        if not torch.cuda.is_available():
            raise RuntimeError("gmlake_torch.enable(): torch.cuda is not available")
        ext = _import_native() if native is not False else None
        if native and ext is None:
            raise RuntimeError("gmlake_torch.enable(native=True): the extension _gmlake_torch is not "
                               "installed; `pip install --no-build-isolation ./examples/torch`")
        _refuse_if_initialized(torch)
        if ext is not None:
            apply(ext.install)
            _native = ext
            _enabled = True
            if limit is not None:
                set_limit(limit)
            return "native"
        path = find_library(lib)
        _load(path)
        apply(_configure_plugin)
        try:
            alloc = torch.cuda.memory.CUDAPluggableAllocator(path, ALLOC_FN, FREE_FN)
            torch.cuda.memory.change_current_allocator(alloc)
        except Exception as e:
            raise RuntimeError(
                f"gmlake_torch.enable(): PyTorch refused the allocator swap ({type(e).__name__}: {e}). "
                "This happens when CUDA memory was already allocated or the caching allocator "
                "was initialized; call enable() first thing after `import torch`.") from e
        _allocator = alloc
        _enabled = True
        if limit is not None:
            set_limit(limit)
        return _lib_path


def settings():
    """The overrides of gmlake's rules in force ("key:value,...", "" for none), or
    None before enable()."""
    if not _enabled:
        return None
    if _native is not None:
        return _native.settings()
    need = _lib.gmlake_torch_configured(None, 0)
    buf = ctypes.create_string_buffer(int(need))
    _lib.gmlake_torch_configured(buf, need)
    return buf.value.decode()


def is_native():
    """True when gmlake is installed through PyTorch's own allocator interface."""
    return _native is not None


def is_enabled():
    """True once enable() has installed gmlake as PyTorch's allocator."""
    return _enabled


def library_path():
    """Path of the loaded plugin, or None."""
    return _lib_path


def _device_index(device):
    if device is None:
        try:
            import torch
            if torch.cuda.is_initialized():
                return torch.cuda.current_device()
        except Exception:
            pass
        return 0
    if isinstance(device, int):
        return device
    idx = getattr(device, "index", None)  # torch.device
    if idx is not None:
        return idx
    if isinstance(device, str):
        if ":" in device:
            return int(device.rsplit(":", 1)[1])
        return _device_index(None)
    return _device_index(None)


def _raw_stats(device=None):
    """The GmlakeTorchStats of device, or None when gmlake has no allocator there."""
    global _abi_checked
    if _lib is None:
        return None
    s = GmlakeTorchStats()
    if _lib.gmlake_torch_get_stats(_device_index(device), ctypes.byref(s)) != 0:
        return None
    if not _abi_checked:
        if s.struct_size != ctypes.sizeof(GmlakeTorchStats):
            raise RuntimeError(
                f"gmlake_torch: ABI mismatch: the library's gmlake_torch_stats has {s.struct_size} bytes, "
                f"this module's mirror {ctypes.sizeof(GmlakeTorchStats)}; update gmlake_torch.py")
        _abi_checked = True
    return s


def stats_to_dict(s):
    """OrderedDict (sorted keys) of a GmlakeTorchStats with torch.cuda.memory_stats()
    key names where they mean the same, plus gmlake extras under "gmlake."."""
    d = {
        "requested_bytes.all.current": s.requested_bytes_current,
        "requested_bytes.all.peak": s.requested_bytes_peak,
        "allocated_bytes.all.current": s.allocated_bytes_current,
        "allocated_bytes.all.peak": s.allocated_bytes_peak,
        # gmlake frees at once (stream-ordered), so active == allocated
        "active_bytes.all.current": s.allocated_bytes_current,
        "active_bytes.all.peak": s.allocated_bytes_peak,
        "reserved_bytes.all.current": s.reserved_bytes_current,
        "reserved_bytes.all.peak": s.reserved_bytes_peak,
        "allocation.all.current": s.allocation_current,
        "allocation.all.peak": s.allocation_peak,
        "allocation.all.allocated": s.allocation_allocated,
        "allocation.all.freed": s.allocation_freed,
        "active.all.current": s.allocation_current,
        "active.all.peak": s.allocation_peak,
        "active.all.allocated": s.allocation_allocated,
        "active.all.freed": s.allocation_freed,
        "segment.all.current": s.segment_current,
        "segment.all.peak": s.segment_peak,
        "num_alloc_retries": s.num_alloc_retries,
        "num_ooms": s.num_ooms,
        "gmlake.mapped_bytes.current": s.mapped_bytes_current,
        "gmlake.mapped_bytes.peak": s.mapped_bytes_peak,
        "gmlake.stitched_blocks.current": s.stitched_blocks_current,
        "gmlake.stitched_blocks.peak": s.stitched_blocks_peak,
        "gmlake.cached_stitch_hits": s.cached_stitch_hits,
        "gmlake.evictions": s.evictions,
        "gmlake.invalid_frees": s.invalid_frees,
        "gmlake.limit_bytes": s.limit_bytes,
        "gmlake.chunk_bytes": s.chunk_bytes,
    }
    for i in range(5):
        d[f"gmlake.fit.s{i + 1}"] = s.fit[i]
    for i, name in enumerate(DRIVER_CALLS):
        d[f"gmlake.driver_calls.{name}"] = s.driver_calls[i]
    return collections.OrderedDict(sorted(d.items()))


def memory_stats(device=None):
    """Like torch.cuda.memory_stats() for gmlake: an OrderedDict, empty when gmlake
    has no allocator on that device yet (as torch's is before CUDA init). On the
    native path: torch.cuda.memory_stats() plus gmlake's keys ("gmlake.")."""
    if _native is not None:
        import torch
        d = dict(torch.cuda.memory_stats(device))
        d.update(_native.stats(_device_index(device)))
        return collections.OrderedDict(sorted(d.items()))
    s = _raw_stats(device)
    if s is None:
        return collections.OrderedDict()
    return stats_to_dict(s)


_NATIVE_KEYS = {
    "reserved_bytes_current": "reserved_bytes.all.current",
    "reserved_bytes_peak": "reserved_bytes.all.peak",
    "allocated_bytes_current": "allocated_bytes.all.current",
    "allocated_bytes_peak": "allocated_bytes.all.peak",
}


def _stat(field, device):
    if _native is not None:
        import torch
        return int(torch.cuda.memory_stats(device).get(_NATIVE_KEYS[field], 0))
    s = _raw_stats(device)
    return 0 if s is None else int(getattr(s, field))


def memory_reserved(device=None):
    """Physical bytes gmlake holds now (torch.cuda.memory_reserved)."""
    return _stat("reserved_bytes_current", device)


def max_memory_reserved(device=None):
    """Peak physical bytes gmlake held (torch.cuda.max_memory_reserved)."""
    return _stat("reserved_bytes_peak", device)


def memory_allocated(device=None):
    """Bytes of live allocations as placed (torch.cuda.memory_allocated)."""
    return _stat("allocated_bytes_current", device)


def max_memory_allocated(device=None):
    """Peak of memory_allocated (torch.cuda.max_memory_allocated)."""
    return _stat("allocated_bytes_peak", device)


def empty_cache(device=-1):
    """Releases cached stitched blocks and unused chunks (torch.cuda.empty_cache
    does nothing for a pluggable allocator). device -1: all. Returns bytes released."""
    if _native is not None:
        import torch
        before = sum(torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count()))
        torch.cuda.empty_cache()
        return before - sum(torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count()))
    if _lib is None:
        return 0
    dev = -1 if device == -1 else _device_index(device)
    return int(_lib.gmlake_torch_empty_cache(dev))


def reset_peak_memory_stats(device=None):
    """Resets gmlake's peaks to the current values (device None: current device;
    -1: all devices)."""
    if _native is not None:
        import torch
        for d in (range(torch.cuda.device_count()) if device == -1 else [_device_index(device)]):
            torch.cuda.reset_peak_memory_stats(d)
        return
    if _lib is None:
        return
    dev = -1 if device == -1 else _device_index(device)
    _lib.gmlake_torch_reset_peak_stats(dev)


def plot_layout(path, device=None, snapshot=None):
    """Draws where the reserved bytes are (native path) into an image file at path:
    one row per segment of torch.cuda.memory._snapshot(), that is per handle of
    gmlake's small and large arenas and per stitched block, each piece coloured as
    allocated, mapped by a stitched block, or free. Needs matplotlib. Returns path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if snapshot is None:
        import torch
        snapshot = torch.cuda.memory._snapshot()
    dev = _device_index(device)
    segs = [s for s in snapshot["segments"] if s.get("device", 0) == dev]
    kinds = _native.segment_kinds(dev) if _native is not None else {}
    order = {"small": 0, "large": 1, "stitched": 2}
    segs.sort(key=lambda s: (order.get(kinds.get(s["address"], "large"), 1), s["address"]))
    colours = {"active_allocated": "#d62728", "active_pending_free": "#ff7f0e", "inactive": "#c7e9c0"}
    stitched_colour = "#1f77b4"
    fig_h = max(2.5, 0.18 * len(segs) + 1.5)
    fig, ax = plt.subplots(figsize=(11, min(fig_h, 40)))
    totals = collections.Counter()
    for row, s in enumerate(segs):
        x = 0
        for b in s["blocks"]:
            state = b["state"]
            colour = colours.get(state, "#999999")
            if state == "active_pending_free":  # active, not allocated: a piece a stitched block maps
                colour = stitched_colour
            ax.barh(row, b["size"] / 2**20, left=x / 2**20, color=colour, edgecolor="none", height=0.8)
            x += b["size"]
            totals[state] += b["size"]
    ax.set_yticks(range(len(segs)))
    ax.set_yticklabels([f'{kinds.get(s["address"], "segment")} {s["address"]:#x}' for s in segs], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("MiB within the segment")
    reserved = sum(s["total_size"] for s in segs)
    ax.set_title(f"gmlake on cuda:{dev}: {len(segs)} segments, {reserved / 2**30:.2f} GiB mapped; "
                 f"allocated {totals['active_allocated'] / 2**30:.2f} GiB")
    ax.legend(handles=[Patch(color=colours["active_allocated"], label="allocated"),
                       Patch(color=stitched_colour, label="mapped by a stitched block"),
                       Patch(color=colours["inactive"], label="free")], loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
