// tests/fuzz/fuzz_allocator.cpp - libFuzzer target: the input is a program of
// allocate / free / release_cached / stream / fault operations on one allocator
// over the host_memfd backend (real memory), with a one-off backend fault of any
// kind now and then, sometimes followed by a failure of the undo call after it
// (fault_injecting).
//
// After every step: check_invariants() (and GMLAKE_DEBUG=2 asserts inside), and
// every live block still holds its pattern, read through its pointer and through
// its chunks (the backing file, read with pread at the offset the backend maps
// there: a wrong mapping or two blocks sharing bytes both show). At the end:
// everything freed, release_cached(), nothing reserved or mapped.
//
// Build and run: `bash .ci/fuzz [SECONDS]`, which does
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
//     -DGMLAKE_DEBUG=2 -Iinclude tests/fuzz/fuzz_allocator.cpp -o build-fuzz/fuzz_allocator
//     (one command)
//   build-fuzz/fuzz_allocator -max_total_time=60 build-fuzz/corpus tests/fuzz/corpus
// The seed corpus tests/fuzz/corpus holds random seeds, one hand-made stitching
// program, and inputs that once crashed (regress-*); tests/test_fuzz_corpus.cpp
// replays them all in the normal test builds.
#include <gmlake/backend/host_memfd.hpp>
#include <gmlake/gmlake.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using gmlake::backend::fault;
using gmlake::backend::fault_injecting;
using gmlake::backend::host_memfd;
namespace policy = gmlake::policy;

constexpr std::size_t kib = 1024;
constexpr std::size_t C = 64 * kib;
constexpr std::size_t cap = 32 * C;

using backend_t = fault_injecting<host_memfd>;
using alloc_t = gmlake::basic_allocator<backend_t, policy::best_fit_pieces, policy::lru>;

[[noreturn]] void fail(const char* what, std::size_t i) {
  std::fprintf(stderr, "fuzz_allocator: %s (step %zu)\n", what, i);
  std::abort();
}

void on_misuse(const char* what, void*) {
  std::fprintf(stderr, "fuzz_allocator: unexpected misuse: %s\n", what);
  std::abort();
}

/// Reads the input a byte at a time; zeros past its end.
struct reader {
  const std::uint8_t* p;
  std::size_t n;
  std::size_t at = 0;
  [[nodiscard]] bool done() const { return at >= n; }
  std::uint8_t byte() { return at < n ? p[at++] : 0; }
  std::uint16_t word() { return static_cast<std::uint16_t>(byte() | (byte() << 8)); }
};

struct block {
  unsigned char* p;
  std::size_t n;        ///< bytes usable (the request, at least 1)
  std::size_t asked;    ///< the request, as given to allocate
  std::uintptr_t stream;
  std::uint32_t seed;
};

unsigned char pat(std::uint32_t seed, std::size_t k) {
  return static_cast<unsigned char>(((seed * 1000003u + k) * 2654435761u) >> 24);
}

/// The bytes a block's pattern covers: every 64th, and the last.
template <class F>
void each_marked(const block& b, F f) {
  for (std::size_t i = 0; i < b.n; i += 64) f(i);
  if ((b.n - 1) % 64 != 0) f(b.n - 1);
}

void fill(const block& b) {
  each_marked(b, [&](std::size_t i) { b.p[i] = pat(b.seed, i); });
}

/// One marked byte, read through the chunk mapped under it: the backing file at the
/// offset the backend maps there, read with pread.
bool through_chunk(const block& b, const host_memfd& m, std::size_t i) {
  const auto off = m.offset_of(reinterpret_cast<std::uintptr_t>(b.p) + i);
  unsigned char c = 0;
  return off && m.read_file(off.value, &c, 1) && c == pat(b.seed, i);
}

/// Full: every marked byte through the pointer, and through the chunks the first,
/// the last and one per 4 KiB page (at a free and at the end). Light (after every
/// step, for every live block): first, last and two marked bytes picked by `salt`,
/// each through the pointer and through the chunk.
bool intact(const block& b, const host_memfd& m, bool full, std::uint32_t salt = 0) {
  if (full) {
    bool ok = true;
    each_marked(b, [&](std::size_t i) { ok = ok && b.p[i] == pat(b.seed, i); });
    if (!ok) return false;
    for (std::size_t i = 0; i < b.n; i += 4096)
      if (!through_chunk(b, m, i)) return false;
    return through_chunk(b, m, b.n - 1);
  }
  const std::size_t marks = (b.n - 1) / 64 + 1;
  const std::size_t at[4] = {0, b.n - 1, (salt * 2654435761u % marks) * 64, ((salt + b.seed) * 40503u % marks) * 64};
  for (std::size_t i : at)
    if (b.p[i] != pat(b.seed, i) || !through_chunk(b, m, i)) return false;
  return true;
}

std::size_t size_from(reader& r) {
  const std::uint8_t k = r.byte();
  const std::uint16_t w = r.word();
  switch (k % 4) {
    case 0: return w % (2 * kib);                       // tiny, 0 included
    case 1: return w % (16 * kib) + 1;                  // small arena
    case 2: return 16 * kib + (w * 8u) % (3 * C);       // up to a few chunks
    default: return C * (1 + w % 8) - (w % 3) * 512;    // whole chunks, near them
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader r{data, size};
  gmlake::options opt;
  opt.small_max = (r.byte() % 2) ? 16 * kib : 4 * kib;
  opt.on_misuse = &on_misuse;
  const std::uint8_t setup = r.byte();
  const std::size_t max_blocks = setup % 4;  // 0: every freed stitch is evicted
  policy::best_fit_pieces stitch;
  if (setup & 4) stitch.edges = 512;  // stitch edges on (bit 2 is clear in the regress-* inputs)
  if ((setup >> 4) % 4 == 2) {  // borrowing of up to 4 chunks, settled early (never so in the regress-* inputs)
    stitch.grow.lends.borrow_max = 4 * C;
    opt.settle_window = 1;
    opt.settle_divisor = 1;
  } else if ((setup >> 4) % 4 == 3) {  // no borrowing
    stitch.grow.lends.borrow_max = 0;
  }
  alloc_t a(backend_t(cap, C), opt, stitch, policy::lru{std::size_t{1} << 40, max_blocks});
  host_memfd& m = a.backend().parent();
  std::vector<block> live;
  std::uint32_t serial = 0;
  std::size_t step = 0;

  for (; !r.done() && step < 256; ++step) {
    const std::uint8_t op = r.byte();
    switch (op % 10) {
      case 0: case 1: case 2: case 3: {  // allocate
        const std::size_t n = size_from(r);
        const std::uint8_t x = r.byte();
        const std::uintptr_t stream = x % 4;
        const std::size_t alignment = (x & 0x40) ? std::size_t{1} << (9 + (x >> 2) % 8) : 512;  // 512 B .. 64 KiB
        void* p = a.try_allocate(n, gmlake::host_stream{stream}, alignment);
        if (p == nullptr) break;  // out of memory, or a fault: allowed
        if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) fail("misaligned block", step);
        const block b{static_cast<unsigned char*>(p), n == 0 ? 1 : n, n, stream, ++serial};
        fill(b);
        live.push_back(b);
        break;
      }
      case 4: case 5: case 6: {  // free, on its stream or another one
        if (live.empty()) break;
        const std::size_t k = r.byte() % live.size();
        const std::uint8_t x = r.byte();
        const block b = live[k];
        if (!intact(b, m, true)) fail("block changed before its free", step);
        live[k] = live.back();
        live.pop_back();
        a.deallocate(b.p, (x & 1) ? b.asked : 0,
                     gmlake::host_stream{(x & 2) ? static_cast<std::uintptr_t>(x >> 2) % 4 : b.stream});
        break;
      }
      case 7:
        (void)a.release_cached();
        break;
      case 8: {  // streams: hold work pending, or finish it
        const std::uint8_t x = r.byte();
        if (x % 3 == 0) m.set_auto_complete(!m.auto_complete());
        else if (x % 3 == 1) m.complete(gmlake::host_stream{x % 4u});
        else m.complete_all();
        break;
      }
      default: {  // one-off backend fault a few calls ahead
        const std::uint8_t x = r.byte();
        const auto k = static_cast<fault>(x % gmlake::backend::fault_count);
        a.backend().fail_at(k, a.backend().calls(k) + 1 + (x >> 4) % 4, gmlake::backend::default_error(k));
        // Two failures in one operation: the step, then the undo call after it.
        if (const unsigned then = x >> 6; then != 0)
          a.backend().then_fail(then == 1 ? fault::unmap : then == 2 ? fault::release : fault::address_free);
        break;
      }
    }
    if (!a.check_invariants()) fail("invariants broken", step);
    for (const block& b : live)
      if (!intact(b, m, false, static_cast<std::uint32_t>(step))) fail("live block changed", step);
  }

  a.backend().disarm();
  for (const block& b : live) {
    if (!intact(b, m, true)) fail("block changed by the end", step);
    a.deallocate(b.p, b.asked, gmlake::host_stream{b.stream});
  }
  m.complete_all();
  (void)a.release_cached();
  const auto s = a.stats();
  if (!a.check_invariants() || s.allocations.current != 0 || s.reserved_bytes.current != 0 ||
      s.mapped_bytes.current != 0 || s.stitched_blocks.current != 0 || s.invalid_frees != 0)
    fail("not everything released at the end", step);
  if (m.chunk_count() != 0 || m.mapping_count() != 0 || m.reservation_count() != 2)
    fail("the backend still holds memory", step);
  return 0;
}
