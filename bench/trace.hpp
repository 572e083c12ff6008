// bench/trace.hpp - reads an allocation trace (format: bench/traces/README.md) into
// memory: allocation ids made dense, events in program order.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

namespace gmlake_bench {

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

/// Reads a gzipped trace through `gzip -dc` (no zlib dependency). False if the file
/// cannot be read or holds no event.
inline bool load(const std::string& path, trace& t) {
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

} // namespace gmlake_bench
