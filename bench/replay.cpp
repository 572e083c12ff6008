// gmlake-replay: replays allocation traces (format: bench/traces/README.md) through
// every built-in configuration on the simulated backend, and prints what each
// reserves.
//
//   gmlake-replay [--json] [--config NAME]... [--cost-model FILE] TRACE.trace.gz...
//
// Peak live = peak of the sum of live requests, each rounded up to 512 B.
// Fragmentation = 1 - peak live / peak reserved. Backend calls after the `i 4`
// marker are costed with the H200 cost model (bench/h200-vmm-cost-model.txt).
#include <gmlake/gmlake.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>
#include <unordered_map>
#include <vector>

namespace {

struct event {
  enum kind_t : unsigned char { alloc, free, iter } kind;
  std::uint32_t id;       // dense allocation index (alloc, free) or iteration number
  std::uint64_t bytes;    // alloc
  std::uintptr_t stream;  // alloc
};

struct trace {
  std::string name;
  std::vector<event> events;
  std::uint32_t ids = 0;
  std::size_t allocs = 0;
};

bool load(const std::string& path, trace& t) {
  const std::string cmd = "gzip -dc '" + path + "'";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return false;
  std::unordered_map<std::uint64_t, std::uint32_t> ids;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    if (line[0] == 'a') {
      unsigned long long id, bytes, stream;
      if (std::sscanf(line + 1, "%llu %llu %llu", &id, &bytes, &stream) != 3) continue;
      const auto dense = static_cast<std::uint32_t>(ids.size());
      ids.emplace(id, dense);
      t.events.push_back({event::alloc, dense, bytes, static_cast<std::uintptr_t>(stream)});
      ++t.allocs;
    } else if (line[0] == 'f') {
      unsigned long long id;
      if (std::sscanf(line + 1, "%llu", &id) != 1) continue;
      auto it = ids.find(id);
      if (it != ids.end()) t.events.push_back({event::free, it->second, 0, 0});
    } else if (line[0] == 'i') {
      unsigned n;
      if (std::sscanf(line + 1, "%u", &n) == 1) t.events.push_back({event::iter, n, 0, 0});
    }
  }
  const int rc = pclose(f);
  t.ids = static_cast<std::uint32_t>(ids.size());
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (auto p = base.find(".trace"); p != std::string::npos) base.resize(p);
  t.name = base;
  return rc == 0 && !t.events.empty();
}

/// Microseconds per backend call kind (per chunk for map, set_access, unmap).
struct cost_model {
  double reserve = 1, address_free = 1, create = 11, release = 11, map_per_chunk = 1,
         set_access_per_chunk = 25, unmap_per_chunk = 16;

  bool read(const std::string& path) {
    std::ifstream in(path);
    if (!in) return false;
    std::string key;
    double v;
    std::map<std::string, double*> keys = {{"reserve", &reserve},
                                           {"address_free", &address_free},
                                           {"create", &create},
                                           {"release", &release},
                                           {"map_per_chunk", &map_per_chunk},
                                           {"set_access_per_chunk", &set_access_per_chunk},
                                           {"unmap_per_chunk", &unmap_per_chunk}};
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ls(line);
      if (ls >> key >> v) {
        if (auto it = keys.find(key); it != keys.end()) *it->second = v;
      }
    }
    return true;
  }

  template <class Counts>
  double us(const Counts& c, std::size_t granularity) const {
    auto n = [&](gmlake::call k) { return static_cast<double>(c.calls[static_cast<std::size_t>(k)]); };
    auto chunks = [&](gmlake::call k) {
      return static_cast<double>(c.bytes[static_cast<std::size_t>(k)]) / static_cast<double>(granularity);
    };
    using gmlake::call;
    return reserve * n(call::reserve) + address_free * n(call::address_free) + create * n(call::create) +
           release * n(call::release) + map_per_chunk * chunks(call::map) +
           set_access_per_chunk * chunks(call::set_access) + unmap_per_chunk * chunks(call::unmap);
  }
};

struct outcome {
  std::string allocator;
  std::uint64_t peak_live = 0, peak_reserved = 0, peak_mapped = 0, failed = 0;
  std::uint64_t calls = 0, creates_after_4 = 0, calls_after_4 = 0;
  double driver_us_per_iter_after_4 = 0, ns_per_op = 0;
  std::uint64_t iters_after_4 = 0, stitches = 0, cached_hits = 0;
  std::array<std::uint64_t, gmlake::fit_state_count> fit{};
  bool invariants = true;
};

using backend = gmlake::backend::counting<gmlake::backend::simulated>;

template <class Allocator>
outcome replay(const trace& t, const char* name, const cost_model& cost, Allocator& a) {
  outcome o;
  o.allocator = name;
  std::vector<void*> ptrs(t.ids, nullptr);
  std::vector<std::uint64_t> sizes(t.ids, 0);
  std::vector<std::uintptr_t> streams(t.ids, 0);
  std::uint64_t live = 0;
  backend::call_counts at4{};
  bool seen4 = false;
  std::uint64_t ops = 0;
  const bool tty = isatty(STDERR_FILENO) != 0;
  const std::size_t step = t.events.size() / 100 + 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    switch (e.kind) {
      case event::alloc: {
        void* p = a.try_allocate(e.bytes, e.stream);
        ++ops;
        if (p == nullptr) {
          ++o.failed;
          break;
        }
        ptrs[e.id] = p;
        streams[e.id] = e.stream;
        sizes[e.id] = gmlake::round_up(e.bytes == 0 ? 1 : e.bytes, 512);
        live += sizes[e.id];
        if (live > o.peak_live) o.peak_live = live;
        break;
      }
      case event::free:
        if (ptrs[e.id] != nullptr) {
          a.deallocate(ptrs[e.id], 0, streams[e.id]);  // PyTorch frees on the allocating stream
          ++ops;
          live -= sizes[e.id];
          ptrs[e.id] = nullptr;
        }
        break;
      case event::iter:
        if (e.id >= 4) ++o.iters_after_4;
        if (e.id == 4 && !seen4) {
          seen4 = true;
          at4 = a.backend().counts();
        }
        break;
    }
    if (tty && i % step == 0)
      std::fprintf(stderr, "\r  %-20s %-14s %3zu%%", t.name.c_str(), name, i * 100 / t.events.size());
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (tty) std::fprintf(stderr, "\r%60s\r", "");
  const auto st = a.stats();
  const auto& now = a.backend().counts();
  o.peak_reserved = static_cast<std::uint64_t>(st.reserved_bytes.peak);
  o.peak_mapped = static_cast<std::uint64_t>(st.mapped_bytes.peak);
  for (auto c : now.calls) o.calls += c;
  o.fit = st.fit;
  o.cached_hits = st.cached_stitch_hits;
  o.stitches = static_cast<std::uint64_t>(st.stitched_blocks.allocated);
  if (seen4) {
    backend::call_counts d{};
    for (std::size_t k = 0; k < gmlake::call_count; ++k) {
      d.calls[k] = now.calls[k] - at4.calls[k];
      d.bytes[k] = now.bytes[k] - at4.bytes[k];
      o.calls_after_4 += d.calls[k];
    }
    o.creates_after_4 = d.calls[static_cast<std::size_t>(gmlake::call::create)];
    o.driver_us_per_iter_after_4 =
        o.iters_after_4 ? cost.us(d, a.backend().granularity()) / static_cast<double>(o.iters_after_4) : 0;
  }
  o.ns_per_op = ops ? std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(ops) : 0;
  o.invariants = a.check_invariants();
  // Leave nothing behind: free what the trace never freed.
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    if (ptrs[i]) a.deallocate(ptrs[i], 0, streams[i]);
  a.release_cached();
  o.invariants = o.invariants && a.check_invariants() && a.stats().reserved_bytes.current == 0;
  return o;
}

template <class Allocator, class... Policies>
outcome run(const trace& t, const char* name, const cost_model& cost, Policies... p) {
  gmlake::options opt;
  auto a = std::make_unique<Allocator>(backend(std::size_t{1} << 40), opt, p...);
  return replay(t, name, cost, *a);
}

outcome run_config(const trace& t, const std::string& config, const cost_model& cost) {
  using namespace gmlake;
  if (config == "gmlake") return run<gmlake_allocator<backend>>(t, "gmlake", cost);
  if (config == "bfc") return run<bfc_allocator<backend>>(t, "bfc", cost);
  if (config == "expandable") return run<expandable_allocator<backend>>(t, "expandable", cost);
  if (config == "gmlake-paper")
    return run<gmlake_paper_allocator<backend>>(t, "gmlake-paper", cost, gmlake_paper_stitch);
  if (config == "largest-first")
    return run<gmlake_paper_allocator<backend>>(t, "largest-first", cost, policy::largest_first{});
  outcome o;
  o.allocator = config;
  o.failed = ~0ull;
  return o;
}

double gb(std::uint64_t b) { return static_cast<double>(b) / 1e9; }
double frag(const outcome& o) {
  return o.peak_reserved ? 1.0 - static_cast<double>(o.peak_live) / static_cast<double>(o.peak_reserved) : 0;
}

} // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<std::string> configs, files;
  std::string cost_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--config" && i + 1 < argc) configs.push_back(argv[++i]);
    else if (a == "--cost-model" && i + 1 < argc) cost_path = argv[++i];
    else if (a == "-h" || a == "--help") {
      std::puts("usage: gmlake-replay [--json] [--config gmlake|bfc|expandable|gmlake-paper|largest-first]... "
                "[--cost-model FILE] TRACE.trace.gz...");
      return 0;
    } else files.push_back(a);
  }
  if (files.empty()) {
    std::fputs("gmlake-replay: no trace given (try --help)\n", stderr);
    return 2;
  }
  if (configs.empty()) configs = {"gmlake", "bfc", "expandable", "gmlake-paper"};
  cost_model cost;
  if (!cost_path.empty() && !cost.read(cost_path)) {
    std::fprintf(stderr, "gmlake-replay: cannot read %s\n", cost_path.c_str());
    return 2;
  }
  int rc = 0;
  if (!json)
    std::printf("%-18s %-13s %9s %9s %9s %7s %9s %9s %11s %8s\n", "trace", "allocator", "allocs", "live GB",
                "reserv GB", "frag", "calls", "creates>4", "drv us/it>4", "ns/op");
  for (const auto& f : files) {
    trace t;
    if (!load(f, t)) {
      std::fprintf(stderr, "gmlake-replay: cannot read trace %s\n", f.c_str());
      rc = 1;
      continue;
    }
    std::vector<outcome> out;
    for (const auto& c : configs) {
      outcome o = run_config(t, c, cost);
      if (o.failed == ~0ull) {
        std::fprintf(stderr, "gmlake-replay: unknown configuration %s\n", c.c_str());
        return 2;
      }
      if (o.failed) rc = 1;
      if (!o.invariants) {
        std::fprintf(stderr, "gmlake-replay: %s: invariants broken or memory left after release\n", c.c_str());
        rc = 1;
      }
      if (json) {
        std::printf("{\"trace\":\"%s\",\"allocator\":\"%s\",\"allocs\":%zu,\"failed\":%llu,\"peak_live_bytes\":%llu,"
                    "\"peak_reserved_bytes\":%llu,\"peak_mapped_bytes\":%llu,\"fragmentation\":%.6f,"
                    "\"backend_calls\":%llu,\"calls_after_4\":%llu,\"creates_after_4\":%llu,"
                    "\"driver_us_per_iter_after_4\":%.1f,\"ns_per_op\":%.1f,\"s1\":%llu,\"s2\":%llu,\"s3\":%llu,"
                    "\"s4\":%llu,\"s5\":%llu,\"cached_stitch_hits\":%llu,\"stitched_blocks\":%llu}\n",
                    t.name.c_str(), o.allocator.c_str(), t.allocs, (unsigned long long)o.failed,
                    (unsigned long long)o.peak_live, (unsigned long long)o.peak_reserved,
                    (unsigned long long)o.peak_mapped, frag(o), (unsigned long long)o.calls,
                    (unsigned long long)o.calls_after_4, (unsigned long long)o.creates_after_4,
                    o.driver_us_per_iter_after_4, o.ns_per_op, (unsigned long long)o.fit[0],
                    (unsigned long long)o.fit[1], (unsigned long long)o.fit[2], (unsigned long long)o.fit[3],
                    (unsigned long long)o.fit[4], (unsigned long long)o.cached_hits, (unsigned long long)o.stitches);
      } else {
        std::printf("%-18s %-13s %9zu %9.2f %9.2f %6.1f%% %9llu %9llu %11.1f %8.0f%s\n", t.name.c_str(),
                    o.allocator.c_str(), t.allocs, gb(o.peak_live), gb(o.peak_reserved), 100 * frag(o),
                    (unsigned long long)o.calls, (unsigned long long)o.creates_after_4, o.driver_us_per_iter_after_4,
                    o.ns_per_op, o.failed ? "  FAILED ALLOCATIONS" : "");
      }
      std::fflush(stdout);
      out.push_back(o);
    }
    if (!json) {
      const outcome* g = nullptr;
      const outcome* b = nullptr;
      for (const auto& o : out) {
        if (o.allocator == "gmlake") g = &o;
        if (o.allocator == "bfc") b = &o;
      }
      if (g && b && b->peak_reserved)
        std::printf("  -> %s: gmlake reserves %.2f GB less than bfc (%.1f%% of bfc's %.2f GB)\n", t.name.c_str(),
                    gb(b->peak_reserved) - gb(g->peak_reserved),
                    100.0 * (1.0 - static_cast<double>(g->peak_reserved) / static_cast<double>(b->peak_reserved)),
                    gb(b->peak_reserved));
    }
  }
  return rc;
}
