/* gmlake_torch.h - the C interface of libgmlake_torch.so, the PyTorch plugin.
 *
 * What holds for all of it:
 *  - one gmlake allocator per CUDA device, on the CUDA VMM backend, made on the
 *    first allocation on that device (or by gmlake_torch_set_limit);
 *  - every function is thread safe and never throws or exits; failure is a
 *    return value, with a message from gmlake_torch_last_error();
 *  - device = -1 means "every device" where a function says so.
 *
 * PyTorch loads the first two through torch.cuda.memory.CUDAPluggableAllocator;
 * the rest are read through ctypes (examples/torch/gmlake_torch.py).
 */
#ifndef GMLAKE_TORCH_H
#define GMLAKE_TORCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* gmlake_torch_stream; /* == cudaStream_t */

/** Allocates size bytes on device for use on stream. size 0 gives a distinct
 *  pointer. On failure it throws (C++): gmlake::out_of_memory (a std::bad_alloc)
 *  when memory ran out, gmlake::backend_error (a std::runtime_error) with the
 *  driver's message otherwise; PyTorch turns either into a Python exception.
 *  With the environment variable GMLAKE_TORCH_ON_FAILURE=null it returns NULL
 *  instead (PyTorch's pluggable path does not check for NULL). */
void* gmlake_torch_alloc(ssize_t size, int device, gmlake_torch_stream stream);

/** Frees ptr, last used on stream. Unknown pointers are counted
 *  (invalid_frees) and otherwise ignored. */
void gmlake_torch_free(void* ptr, ssize_t size, int device, gmlake_torch_stream stream);

/** Plain-C snapshot of one device's statistics. Byte gauges are
 *  current/peak pairs; counters are totals since the allocator was made. */
typedef struct gmlake_torch_stats {
  uint64_t struct_size;              /* sizeof(gmlake_torch_stats), for ABI checks */
  int64_t requested_bytes_current;   /* bytes asked for by live allocations */
  int64_t requested_bytes_peak;
  int64_t allocated_bytes_current;   /* live allocations as placed (512 B multiples) */
  int64_t allocated_bytes_peak;
  int64_t reserved_bytes_current;    /* physical bytes held from the driver */
  int64_t reserved_bytes_peak;
  int64_t mapped_bytes_current;      /* virtual bytes mapped (arenas + stitched blocks) */
  int64_t mapped_bytes_peak;
  int64_t allocation_current;        /* live allocations */
  int64_t allocation_peak;
  int64_t allocation_allocated;      /* allocations made in total */
  int64_t allocation_freed;          /* allocations freed in total */
  int64_t segment_current;           /* physical chunks held */
  int64_t segment_peak;
  int64_t stitched_blocks_current;   /* stitched blocks mapped (active or cached) */
  int64_t stitched_blocks_peak;
  uint64_t num_alloc_retries;        /* requests that released the cache and retried */
  uint64_t num_ooms;                 /* requests that failed */
  uint64_t cached_stitch_hits;       /* requests served by a cached stitched block */
  uint64_t evictions;                /* stitched blocks released by the LRU policy */
  uint64_t invalid_frees;            /* frees of pointers not live here */
  uint64_t fit[5];                   /* requests by BestFit state S1..S5 */
  uint64_t driver_calls[8];          /* reserve, address_free, create, release, map,
                                        set_access, unmap, record */
  int64_t limit_bytes;               /* reserved-bytes cap, 0 = none */
  uint64_t chunk_bytes;              /* physical chunk size (granularity) */
} gmlake_torch_stats;

/** Fills *out for device. Returns 0, or -1 (no allocator on that device yet,
 *  or out is NULL). */
int gmlake_torch_get_stats(int device, gmlake_torch_stats* out);

/** Caps the physical bytes the device's allocator may hold (0: no cap), like
 *  torch.cuda.set_per_process_memory_fraction. May be called before the first
 *  allocation (it then makes the allocator) or any time after; a cap below what
 *  is held makes later growth fail once the cache is released. device -1: all
 *  visible devices. Returns 0, or -1 on error (see gmlake_torch_last_error). */
int gmlake_torch_set_limit(int device, uint64_t bytes);

/** Sets the overrides of gmlake's rules that every device's allocator is made
 *  with: "key:value,key:value" (the keys of gmlake/settings.hpp: chunk sizes, the
 *  growth floor, stitch edges, ...; "" for none). Without this call the first
 *  allocator made reads the environment variable GMLAKE_ALLOC_CONF. Returns 0;
 *  -1 when conf is not valid (the message names the item); -2 when an allocator
 *  was made already with other settings (they cannot change then). */
int gmlake_torch_configure(const char* conf);

/** Writes the settings in force ("" before the first allocator is made and
 *  without gmlake_torch_configure) to out, at most size bytes with the NUL.
 *  Returns the bytes the whole text needs with its NUL. */
uint64_t gmlake_torch_configured(char* out, uint64_t size);

/** Releases cached stitched blocks and unused chunks (torch.cuda.empty_cache).
 *  device -1: all devices. Returns the bytes given back to the driver. */
uint64_t gmlake_torch_empty_cache(int device);

/** Resets the peaks to the current values (device -1: all). */
void gmlake_torch_reset_peak_stats(int device);

/** The last error message of this thread ("" if none). */
const char* gmlake_torch_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* GMLAKE_TORCH_H */
