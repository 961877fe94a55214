// Every fuzz target over its seed corpus (tests/fuzz/corpus/<target>/) and over every input a
// fuzzing run ever found a problem with (tests/fuzz/regressions/<target>/): each must be read or
// rejected with kvsim's own error. Under the sanitizer build this also checks memory and UB.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/fuzz/targets.hpp"

namespace kvsim::test {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> out;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(KVSIM_TEST_DATA).parent_path() / "fuzz" / kind / target;
    if (!fs::exists(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class FuzzInputs : public ::testing::TestWithParam<fuzz::NamedTarget> {};

TEST_P(FuzzInputs, AreReadOrRejectedCleanly) {
  const auto inputs = inputs_of(GetParam().name);
  EXPECT_FALSE(inputs.empty()) << "no seed corpus for " << GetParam().name;
  for (const auto& path : inputs) {
    SCOPED_TRACE(path.string());
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NO_THROW(
        GetParam().run(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzInputs, ::testing::ValuesIn(fuzz::all_targets()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvsim::test
