// gmlake-replay: replays allocation traces (format: bench/traces/README.md) through
// every built-in configuration on the simulated backend, and prints what each
// reserves.
//
//   gmlake-replay [--json] [--config NAME]... [--cost-model FILE] [--settings KEY:VALUE,...] TRACE.trace.gz...
//
// --settings overrides the configurations' rules with the keys of gmlake/settings.hpp,
// as GMLAKE_ALLOC_CONF does in the PyTorch integration (--help lists the older flags,
// each one key).
//
// Peak live = peak of the sum of live requests, each rounded up to 512 B.
// Fragmentation = 1 - peak live / peak reserved. Backend calls after the `i 4`
// marker are costed with the H200 cost model (bench/h200-vmm-cost-model.txt).
#include <gmlake/gmlake.hpp>

#include "trace.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <unordered_map>
#include <vector>

namespace {

using gmlake_bench::event;
using gmlake_bench::load;
using gmlake_bench::trace;

/// Modelled driver time: microseconds per call and per physical handle, by handle
/// size. Each key has points (MiB, us) measured on the H200; between points the
/// cost is interpolated linearly in log2(size), outside them it is clamped. A key
/// with a single value is a flat cost. map, set_access and unmap are charged per
/// handle in the range (their cost grows with the number of handles, not bytes);
/// reserve and address_free per call by reservation size; create and release per
/// handle by its size.
struct cost_model {
  struct curve {
    std::vector<std::pair<double, double>> points;  // (log2 bytes, us)
    double at(std::size_t bytes) const {
      if (points.empty()) return 0;
      const double x = std::log2(static_cast<double>(bytes ? bytes : 1));
      if (x <= points.front().first) return points.front().second;
      if (x >= points.back().first) return points.back().second;
      for (std::size_t i = 1; i < points.size(); ++i)
        if (x <= points[i].first) {
          const auto& [x0, y0] = points[i - 1];
          const auto& [x1, y1] = points[i];
          return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
        }
      return points.back().second;
    }
  };
  std::array<curve, gmlake::call_count> c;

  cost_model() {
    // bench/h200-vmm-cost-model.txt, so the tool works without the file.
    set("reserve", {{2, 0.6}, {20, 0.7}, {512, 5.1}});
    set("address_free", {{2, 0.6}, {20, 0.5}, {512, 4.6}});
    set("create", {{2, 10.9}, {20, 7.6}, {512, 36.0}});
    set("release", {{2, 11.2}, {20, 14.5}, {512, 234.8}});
    set("map", {{2, 0.9}, {20, 0.6}, {512, 1.7}});
    set("set_access", {{2, 24.7}, {20, 20.3}, {512, 75.6}});
    set("unmap", {{2, 16.3}, {20, 13.9}, {512, 33.1}});
  }
  static int index(const std::string& k) {
    for (std::size_t i = 0; i < gmlake::call_count; ++i)
      if (k == gmlake::call_names[i]) return static_cast<int>(i);
    return -1;
  }
  void set(const std::string& k, std::vector<std::pair<double, double>> mib_us) {
    const int i = index(k);
    if (i < 0) return;
    c[i].points.clear();
    for (auto [mib, us] : mib_us) c[i].points.push_back({std::log2(mib * 1048576.0), us});
  }
  bool read(const std::string& path) {
    std::ifstream in(path);
    if (!in) return false;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ls(line);
      std::string key;
      ls >> key;
      std::vector<double> v;
      for (double x; ls >> x;) v.push_back(x);
      if (v.size() == 1) set(key, {{2, v[0]}});
      else if (v.size() >= 2) {
        std::vector<std::pair<double, double>> pts;
        for (std::size_t i = 0; i + 1 < v.size(); i += 2) pts.push_back({v[i], v[i + 1]});
        set(key, pts);
      }
    }
    return true;
  }
  double us(gmlake::call k, std::size_t bytes) const { return c[static_cast<std::size_t>(k)].at(bytes); }
};

/// The simulated backend, counting calls (one per call) and charging each its
/// modelled driver time (per handle: it remembers which handle is mapped where).
class costed : public gmlake::backend::forwarding<gmlake::backend::simulated> {
  using base = gmlake::backend::forwarding<gmlake::backend::simulated>;

 public:
  struct call_counts {
    std::array<std::uint64_t, gmlake::call_count> calls{};
    std::array<double, gmlake::call_count> us_of{};  ///< modelled us by call kind
    double us = 0;
  };

  costed(std::size_t capacity, std::size_t granularity, const cost_model* cost) noexcept
      : base(capacity, granularity), cost_(cost) {}
  const call_counts& counts() const noexcept { return counts_; }
  std::size_t created_bytes() const noexcept { return parent().created_bytes(); }

  gmlake::result<std::uintptr_t> reserve(std::size_t n) noexcept {
    charge(gmlake::call::reserve, n);
    return parent().reserve(n);
  }
  gmlake::errc address_free(std::uintptr_t va, std::size_t n) noexcept {
    charge(gmlake::call::address_free, n);
    return parent().address_free(va, n);
  }
  gmlake::result<chunk_type> create(std::size_t n) noexcept {
    charge(gmlake::call::create, n);
    return parent().create(n);
  }
  gmlake::errc release(chunk_type c) noexcept {
    charge(gmlake::call::release, c.size);
    return parent().release(c);
  }
  gmlake::errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept {
    charge(gmlake::call::map, n);
    const gmlake::errc e = parent().map(va, n, c);
    if (e == gmlake::errc::ok) handles_[va] = n;
    return e;
  }
  gmlake::errc set_access(std::uintptr_t va, std::size_t n) noexcept {
    ++counts_.calls[static_cast<std::size_t>(gmlake::call::set_access)];
    for (auto it = handles_.lower_bound(va); it != handles_.end() && it->first < va + n; ++it)
      add(gmlake::call::set_access, cost_->us(gmlake::call::set_access, it->second));
    return parent().set_access(va, n);
  }
  gmlake::errc unmap(std::uintptr_t va, std::size_t n) noexcept {
    ++counts_.calls[static_cast<std::size_t>(gmlake::call::unmap)];
    auto it = handles_.lower_bound(va);
    while (it != handles_.end() && it->first < va + n) {
      add(gmlake::call::unmap, cost_->us(gmlake::call::unmap, it->second));
      it = handles_.erase(it);
    }
    return parent().unmap(va, n);
  }
  gmlake::result<event_type> record(stream_type s) noexcept {
    ++counts_.calls[static_cast<std::size_t>(gmlake::call::record)];
    return parent().record(s);
  }

 private:
  void charge(gmlake::call k, std::size_t n) noexcept {
    ++counts_.calls[static_cast<std::size_t>(k)];
    add(k, cost_->us(k, n));
  }
  void add(gmlake::call k, double us) noexcept {
    counts_.us += us;
    counts_.us_of[static_cast<std::size_t>(k)] += us;
  }
  const cost_model* cost_;
  call_counts counts_{};
  std::map<std::uintptr_t, std::size_t> handles_;
};
static_assert(gmlake::PhysicalBackend<costed>);

struct outcome {
  std::string allocator;
  std::uint64_t peak_live = 0, peak_reserved = 0, peak_mapped = 0, failed = 0;
  std::uint64_t calls = 0, creates_after_4 = 0, calls_after_4 = 0;
  double driver_us_per_iter_after_4 = 0, ns_per_op = 0;
  std::uint64_t iters_after_4 = 0, stitches = 0, cached_hits = 0, repairs = 0, evictions = 0, stream_waits = 0;
  std::array<std::uint64_t, gmlake::fit_state_count> fit{};
  gmlake::memory_breakdown at_peak{};  ///< where the bytes were when the peak reserved was reached
  std::uint64_t live_at_peak = 0;      ///< live (512 B rounded) then
  std::size_t peak_live_event = 0;     ///< the event after which live was at its peak
  gmlake::memory_breakdown at_live{};  ///< where the bytes were then (knobs::snap_event)
  std::size_t reserved_at_live = 0;    ///< reserved bytes then
  std::size_t chunk = 0;
  std::array<double, gmlake::call_count> us_after_4{};
  std::array<std::uint64_t, gmlake::call_count> calls_after_4_of{};
  bool invariants = true;
};

/// Tunables given on the command line (the same for every configuration): the
/// structural options, and overrides of the stitch policies' fields and growth rules.
struct knobs {
  gmlake::settings set;      ///< overrides of the configurations' rules (--settings and the flags)
  std::size_t pieces = 0;    ///< gmlake's cap on pieces per stitch (its configurations only); 0: the policy's
  std::string timeline_dir;  ///< write TRACE.CONFIG.csv (event, live, reserved) here
  bool log_driver = false;   ///< print every operation after i 4 that cost driver time (stderr)
  std::size_t snap_event = SIZE_MAX;  ///< take outcome::at_live after this event
};

template <class Allocator>
outcome replay(const trace& t, const char* name, const knobs& k, Allocator& a) {
  outcome o;
  o.allocator = name;
  o.chunk = a.chunk_size();
  std::vector<void*> ptrs(t.ids, nullptr);
  std::vector<std::uint64_t> sizes(t.ids, 0);
  std::vector<std::uintptr_t> streams(t.ids, 0);
  std::uint64_t live = 0;
  costed::call_counts at4{};
  bool seen4 = false;
  std::uint64_t ops = 0;
  const bool tty = isatty(STDERR_FILENO) != 0;
  const std::size_t step = t.events.size() / 100 + 1;
  std::size_t peak_created = 0;
  std::chrono::steady_clock::duration aside{};  // time spent on the breakdown, not the allocator
  std::FILE* timeline = nullptr;
  if (!k.timeline_dir.empty()) {
    const std::string path = k.timeline_dir + "/" + t.name + "." + name + ".csv";
    timeline = std::fopen(path.c_str(), "w");
    if (timeline) std::fputs("event,live_bytes,reserved_bytes\n", timeline);
  }
  const std::size_t sample = t.events.size() / 2000 + 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    switch (e.kind) {
      case event::alloc: {
        const double us_before = k.log_driver && seen4 ? a.backend().counts().us : 0;
        const auto calls_before = k.log_driver && seen4 ? a.backend().counts().calls : decltype(at4.calls){};
        void* p = a.try_allocate(e.bytes, gmlake::host_stream{e.stream});
        ++ops;
        if (k.log_driver && seen4 && a.backend().counts().us > us_before) {
          const auto& now_c = a.backend().counts();
          std::fprintf(stderr, "drv %s event %zu alloc %llu stream %llu live %llu: %.0f us;", name, i,
                       (unsigned long long)e.bytes, (unsigned long long)e.stream, (unsigned long long)live,
                       now_c.us - us_before);
          for (std::size_t c = 0; c < gmlake::call_count; ++c)
            if (now_c.calls[c] != calls_before[c])
              std::fprintf(stderr, " %s %llu", gmlake::call_names[c], (unsigned long long)(now_c.calls[c] - calls_before[c]));
          std::fprintf(stderr, "\n");
        }
        if (p == nullptr) {
          ++o.failed;
          break;
        }
        ptrs[e.id] = p;
        streams[e.id] = e.stream;
        sizes[e.id] = gmlake::round_up(e.bytes == 0 ? 1 : e.bytes, 512);
        live += sizes[e.id];
        if (live > o.peak_live) {
          o.peak_live = live;
          o.peak_live_event = i;
        }
        if (a.backend().created_bytes() > peak_created) {  // a new peak reserved: see where the bytes are
          const auto b0 = std::chrono::steady_clock::now();
          peak_created = a.backend().created_bytes();
          o.at_peak = a.breakdown();
          o.live_at_peak = live;
          aside += std::chrono::steady_clock::now() - b0;
        }
        break;
      }
      case event::free:
        if (ptrs[e.id] != nullptr) {
          a.deallocate(ptrs[e.id], 0, gmlake::host_stream{streams[e.id]});  // PyTorch frees on the allocating stream
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
    if (i == k.snap_event) {
      const auto b0 = std::chrono::steady_clock::now();
      o.at_live = a.breakdown();
      o.reserved_at_live = a.backend().created_bytes();
      aside += std::chrono::steady_clock::now() - b0;
    }
    if (timeline && i % sample == 0)
      std::fprintf(timeline, "%zu,%llu,%zu\n", i, (unsigned long long)live, a.backend().created_bytes());
    if (tty && i % step == 0)
      std::fprintf(stderr, "\r  %-20s %-14s %3zu%%", t.name.c_str(), name, i * 100 / t.events.size());
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (timeline) std::fclose(timeline);
  if (tty) std::fprintf(stderr, "\r%60s\r", "");
  const auto st = a.stats();
  const auto& now = a.backend().counts();
  o.peak_reserved = static_cast<std::uint64_t>(st.reserved_bytes.peak);
  o.peak_mapped = static_cast<std::uint64_t>(st.mapped_bytes.peak);
  for (auto c : now.calls) o.calls += c;
  o.fit = st.fit;
  o.cached_hits = st.cached_stitch_hits;
  o.repairs = st.cached_stitch_repairs;
  o.evictions = st.evictions;
  o.stream_waits = st.stream_waits;
  o.stitches = static_cast<std::uint64_t>(st.stitched_blocks.allocated);
  if (seen4) {
    for (std::size_t c = 0; c < gmlake::call_count; ++c) {
      o.calls_after_4 += now.calls[c] - at4.calls[c];
      o.calls_after_4_of[c] = now.calls[c] - at4.calls[c];
      o.us_after_4[c] = now.us_of[c] - at4.us_of[c];
    }
    const auto create = static_cast<std::size_t>(gmlake::call::create);
    o.creates_after_4 = now.calls[create] - at4.calls[create];
    o.driver_us_per_iter_after_4 = o.iters_after_4 ? (now.us - at4.us) / static_cast<double>(o.iters_after_4) : 0;
  }
  o.ns_per_op = ops ? std::chrono::duration<double, std::nano>(t1 - t0 - aside).count() / static_cast<double>(ops) : 0;
  o.invariants = a.check_invariants();
  // Leave nothing behind: free what the trace never freed.
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    if (ptrs[i]) a.deallocate(ptrs[i], 0, gmlake::host_stream{streams[i]});
  a.release_cached();
  o.invariants = o.invariants && a.check_invariants() && a.stats().reserved_bytes.current == 0;
  return o;
}

/// Replays t through basic_allocator<costed, Policy> (LRU eviction, best fit: the
/// configurations of configs.hpp differ in their stitch policy only).
template <class Policy>
outcome run(const trace& t, const char* name, const knobs& k, const cost_model& cost, const Policy& p) {
  auto a = std::make_unique<gmlake::basic_allocator<costed, Policy>>(costed(std::size_t{1} << 40, 0, &cost),
                                                                      k.set.applied(gmlake::options{}), k.set.applied(p));
  return replay(t, name, k, *a);
}

/// gmlake with one option changed: each configuration's name and its change.
struct option_config {
  const char* name;
  void (*change)(knobs&);
};
constexpr option_config option_configs[] = {
    {"gmlake", [](knobs&) {}},
    {"gmlake-noedges", [](knobs& e) { e.set.edges = 0; }},
    {"gmlake-noappend", [](knobs& e) { e.set.append_room = 0; }},
    {"gmlake-smallslot", [](knobs& e) { e.set.small_divisor = 0; }},
};

/// Every configuration the tool knows: the named ones of configs.hpp first.
const std::vector<std::string>& config_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"gmlake", "bfc", "expandable", "gmlake-paper", "largest-first"};
    for (const auto& o : option_configs)
      if (std::find(n.begin(), n.end(), o.name) == n.end()) n.emplace_back(o.name);
    return n;
  }();
  return names;
}

outcome run_config(const trace& t, const std::string& config, const knobs& k, const cost_model& cost) {
  using namespace gmlake;
  for (const auto& o : option_configs)
    if (config == o.name) {
      knobs e = k;
      o.change(e);
      policy::best_fit_pieces p;
      if (k.pieces) p.pieces = k.pieces;
      return run(t, o.name, e, cost, p);
    }
  if (config == "bfc") return run(t, "bfc", k, cost, policy::no_stitch{});
  if (config == "expandable") return run(t, "expandable", k, cost, policy::expand_only{});
  if (config == "gmlake-paper") return run(t, "gmlake-paper", k, cost, policy::gmlake_paper{});
  if (config == "largest-first") return run(t, "largest-first", k, cost, policy::largest_first{});
  outcome o;
  o.allocator = config;
  o.failed = ~0ull;
  return o;
}

double gb(std::uint64_t b) { return static_cast<double>(b) / 1e9; }
double frag(const outcome& o) {
  return o.peak_reserved ? 1.0 - static_cast<double>(o.peak_live) / static_cast<double>(o.peak_reserved) : 0;
}

/// The flags that set one settings key: --KEY N for every key (its underscores as
/// dashes), and these older names (`fixed`: the value of a flag that takes none).
struct setting_flag {
  const char* flag;
  const char* key;
  const char* fixed;
};
constexpr setting_flag older_flags[] = {
    {"--max-handle-mib", "max_chunk_mib", nullptr},
    {"--big-handle-mib", "big_chunk_mib", nullptr},
    {"--no-lend", "lend_to_large", "false"},
    {"--lend-to-small", "lend_to_small", "true"},
};

/// The settings item flag `a` stands for, its value taken from argv[i + 1] when it
/// needs one (i advanced); "" when `a` is no such flag or its value is missing.
std::string setting_of(const std::string& a, int& i, int argc, char** argv) {
  for (const auto& f : older_flags)
    if (a == f.flag) {
      if (f.fixed != nullptr) return std::string(f.key) + ":" + f.fixed;
      return i + 1 < argc ? std::string(f.key) + ":" + argv[++i] : "";
    }
  if (a.rfind("--", 0) != 0 || i + 1 >= argc) return "";
  std::string key = a.substr(2);
  std::replace(key.begin(), key.end(), '-', '_');
  for (const auto& k : gmlake::detail_settings::keys)
    if (k.name == key) return key + ":" + argv[++i];
  return "";
}

} // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // Every configuration's tables come from a heap that keeps its pages: glibc would
  // otherwise hand large blocks out as fresh mappings and give them back on free, so
  // each replay would pay the page faults again (on a virtual machine, about 10 us a
  // page), which the warm-up replay below is there to keep out of ns/op.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  bool json = false, breakdown = false;
  std::vector<std::string> configs, files;
  std::string cost_path, settings_text;
  knobs k;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--breakdown") breakdown = true;
    else if (a == "--config" && i + 1 < argc) configs.push_back(argv[++i]);
    else if (a == "--cost-model" && i + 1 < argc) cost_path = argv[++i];
    else if (a == "--timeline" && i + 1 < argc) k.timeline_dir = argv[++i];
    else if (a == "--log-driver") k.log_driver = true;
    else if (a == "--settings" && i + 1 < argc) (settings_text += ',') += argv[++i];
    else if (a == "--pieces" && i + 1 < argc) k.pieces = std::strtoull(argv[++i], nullptr, 10);
    else if (const std::string item = setting_of(a, i, argc, argv); !item.empty()) (settings_text += ',') += item;
    else if (a == "-h" || a == "--help") {
      std::printf("usage: gmlake-replay [--json] [--breakdown] [--config NAME]... [--cost-model FILE]\n"
                  "                     [--timeline DIR] [--log-driver] [--settings KEY:VALUE,...]\n"
                  "                     [--pieces N] [--KEY N]... TRACE.trace.gz...\n"
                  "--pieces: the gmlake configurations' cap on pieces per stitch (0: the policy's)\n"
                  "settings: the keys of gmlake/settings.hpp (GMLAKE_ALLOC_CONF), checked as there;\n"
                  "--KEY N sets one (underscores as dashes: --stitch-edges-mib 0), as do:\n");
      for (const auto& f : older_flags)
        std::printf("  %-24s %s:%s\n", f.flag, f.key, f.fixed != nullptr ? f.fixed : "N");
      std::printf("configurations:");
      for (const auto& n : config_names()) std::printf(" %s", n.c_str());
      std::puts("\n(default: gmlake bfc expandable gmlake-paper). Progress goes to stderr when it is a terminal.");
      return 0;
    } else files.push_back(a);
  }
  if (files.empty()) {
    std::fputs("gmlake-replay: no trace given (try --help)\n", stderr);
    return 2;
  }
  try {
    k.set = gmlake::parse_settings(settings_text);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gmlake-replay: %s\n", e.what());
    return 2;
  }
  if (configs.empty()) configs = {"gmlake", "bfc", "expandable", "gmlake-paper"};
  if (configs.size() == 1 && configs[0] == "all") configs = config_names();
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
      // A warm-up replay of the same configuration, not reported: the first replay
      // of a configuration pays the page faults of a heap growing to its shape
      // (about 30 ns per operation on llama1b-generate), which would otherwise count
      // against whichever configuration comes first, and depend on the order.
      (void)run_config(t, c, k, cost);
      outcome o = run_config(t, c, k, cost);
      if (breakdown && !json && o.failed != ~0ull) {  // again, to see where the bytes are at the peak live
        knobs again = k;
        again.snap_event = o.peak_live_event;
        const outcome o2 = run_config(t, c, again, cost);
        o.at_live = o2.at_live;
        o.reserved_at_live = o2.reserved_at_live;
      }
      if (o.failed == ~0ull) {
        std::fprintf(stderr, "gmlake-replay: unknown configuration %s\n", c.c_str());
        return 2;
      }
      if (o.failed) rc = 1;
      if (!o.invariants) {
        std::fprintf(stderr, "gmlake-replay: %s: invariants broken or memory left after release\n", c.c_str());
        rc = 1;
      }
      const auto& b = o.at_peak;
      if (json) {
        std::printf("{\"trace\":\"%s\",\"allocator\":\"%s\",\"allocs\":%zu,\"failed\":%llu,\"peak_live_bytes\":%llu,"
                    "\"peak_reserved_bytes\":%llu,\"peak_mapped_bytes\":%llu,\"fragmentation\":%.6f,"
                    "\"backend_calls\":%llu,\"calls_after_4\":%llu,\"creates_after_4\":%llu,"
                    "\"driver_us_per_iter_after_4\":%.1f,\"ns_per_op\":%.1f,\"s1\":%llu,\"s2\":%llu,\"s3\":%llu,"
                    "\"s4\":%llu,\"s5\":%llu,\"cached_stitch_hits\":%llu,\"cached_stitch_repairs\":%llu,\"stitched_blocks\":%llu,\"evictions\":%llu,\"stream_waits\":%llu,"
                    "\"chunk_bytes\":%zu,\"iters_after_4\":%llu,\"at_peak\":{\"live\":%llu,\"requested\":%zu,\"active\":%zu,"
                    "\"small_reserved\":%zu,\"small_free\":%zu,\"large_reserved\":%zu,\"large_free_whole\":%zu,"
                    "\"large_free_partial\":%zu,\"free_pending\":%zu,\"cached_stitches\":%zu,\"cached_stitch_bytes\":%zu}}\n",
                    t.name.c_str(), o.allocator.c_str(), t.allocs, (unsigned long long)o.failed,
                    (unsigned long long)o.peak_live, (unsigned long long)o.peak_reserved,
                    (unsigned long long)o.peak_mapped, frag(o), (unsigned long long)o.calls,
                    (unsigned long long)o.calls_after_4, (unsigned long long)o.creates_after_4,
                    o.driver_us_per_iter_after_4, o.ns_per_op, (unsigned long long)o.fit[0],
                    (unsigned long long)o.fit[1], (unsigned long long)o.fit[2], (unsigned long long)o.fit[3],
                    (unsigned long long)o.fit[4], (unsigned long long)o.cached_hits, (unsigned long long)o.repairs,
                    (unsigned long long)o.stitches, (unsigned long long)o.evictions, (unsigned long long)o.stream_waits, o.chunk,
                    (unsigned long long)o.iters_after_4,
                    (unsigned long long)o.live_at_peak, b.requested, b.active, b.small_reserved, b.small_free,
                    b.large_reserved, b.large_free_whole, b.large_free_partial, b.free_pending, b.cached_stitches,
                    b.cached_stitch_bytes);
      } else {
        std::printf("%-18s %-13s %9zu %9.2f %9.2f %6.1f%% %9llu %9llu %11.1f %8.0f%s\n", t.name.c_str(),
                    o.allocator.c_str(), t.allocs, gb(o.peak_live), gb(o.peak_reserved), 100 * frag(o),
                    (unsigned long long)o.calls, (unsigned long long)o.creates_after_4, o.driver_us_per_iter_after_4,
                    o.ns_per_op, o.failed ? "  FAILED ALLOCATIONS" : "");
        if (breakdown) {
          const double mb = 1e6;
          std::printf("    at peak reserved: live %.0f MB (%.0f MB below peak live); inside blocks %.0f MB; small arena "
                      "free %.0f of %.0f MB; large free %.0f MB whole chunks + %.0f MB partial chunks; cached stitches %zu (%.0f MB VA)\n",
                      o.live_at_peak / mb, (o.peak_live - o.live_at_peak) / mb,
                      (b.active - static_cast<double>(o.live_at_peak)) / mb, b.small_free / mb, b.small_reserved / mb,
                      b.large_free_whole / mb, b.large_free_partial / mb, b.cached_stitches,
                      b.cached_stitch_bytes / mb);
          const auto& l = o.at_live;
          std::printf("    at peak live: reserved %.0f MB (%.0f MB over live); inside blocks %.0f MB; small arena "
                      "free %.0f of %.0f MB; large free %.0f MB whole chunks + %.0f MB partial chunks; of the free, "
                      "not yet usable on other streams %.0f MB; cached stitches %zu (%.0f MB VA)\n",
                      o.reserved_at_live / mb, (o.reserved_at_live - static_cast<double>(o.peak_live)) / mb,
                      (l.active - static_cast<double>(o.peak_live)) / mb, l.small_free / mb, l.small_reserved / mb,
                      l.large_free_whole / mb, l.large_free_partial / mb, l.free_pending / mb, l.cached_stitches,
                      l.cached_stitch_bytes / mb);
          std::printf("    after i 4 (calls, us):");
          for (std::size_t c = 0; c < gmlake::call_count; ++c)
            std::printf(" %s %llu %.0f;", gmlake::call_names[c], (unsigned long long)o.calls_after_4_of[c],
                        o.us_after_4[c]);
          std::printf(" S1 %llu S2 %llu S3 %llu S4 %llu hits %llu evictions %llu\n", (unsigned long long)o.fit[0],
                      (unsigned long long)o.fit[1], (unsigned long long)o.fit[2], (unsigned long long)o.fit[3],
                      (unsigned long long)o.cached_hits, (unsigned long long)o.evictions);
        }
      }
      std::fflush(stdout);
      out.push_back(o);
    }
    if (!json) {
      const outcome* g = nullptr;
      const outcome* bf = nullptr;
      for (const auto& o : out) {
        if (o.allocator == "gmlake") g = &o;
        if (o.allocator == "bfc") bf = &o;
      }
      if (g && bf && bf->peak_reserved)
        std::printf("  -> %s: gmlake reserves %.2f GB less than bfc (%.1f%% of bfc's %.2f GB)\n", t.name.c_str(),
                    gb(bf->peak_reserved) - gb(g->peak_reserved),
                    100.0 * (1.0 - static_cast<double>(g->peak_reserved) / static_cast<double>(bf->peak_reserved)),
                    gb(bf->peak_reserved));
    }
  }
  return rc;
}
