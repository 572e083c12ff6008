// tests/test_fuzz_corpus.cpp - every input of the fuzzer's seed corpus, replayed
// through the fuzz target (tests/fuzz/fuzz_allocator.cpp, linked in) in the normal
// test builds: the inputs that once found bugs (regress-*) stay fixed under g++ and
// under ASan+UBSan even where libFuzzer is not available. The target aborts with a
// message on any failed check.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

TEST_CASE("fuzz corpus: every seed input replays cleanly") {
  namespace fs = std::filesystem;
  const fs::path dir = GMLAKE_FUZZ_CORPUS;
  REQUIRE(fs::is_directory(dir));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  CHECK(files.size() >= 10);
  std::size_t regressions = 0;
  for (const auto& f : files) {
    CAPTURE(f.filename().string());
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()) == 0);
    if (f.filename().string().rfind("regress-", 0) == 0) ++regressions;
  }
  CHECK(regressions >= 2);
}
