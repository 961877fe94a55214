// The fuzz targets (tests/fuzz/README and docs/testing.md, "Fuzzing"): each takes
// one input, feeds it to one of kvsim's parsers, and returns normally whether the input is valid
// or rejected with kvsim's own error. Anything else (a crash, a sanitizer report, an exception of
// another type, a leak) is a finding. Built into kvsim_tests too, which replays the seed corpus
// and every past finding (tests/fuzz/regressions/<target>/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim::fuzz {

using Target = void (*)(const std::uint8_t* data, std::size_t size);

void safetensors(const std::uint8_t* data, std::size_t size);   // header and tensor table
void config_json(const std::uint8_t* data, std::size_t size);   // config.json of a checkpoint
void kvtrace(const std::uint8_t* data, std::size_t size);       // HDF5 trace, built from choices
void kvprompt(const std::uint8_t* data, std::size_t size);      // HDF5 prompt file, likewise
void ini_config(const std::uint8_t* data, std::size_t size);    // --config and sweep INI files
void cli_values(const std::uint8_t* data, std::size_t size);    // --set, --grid, budgets, sizes
void result_table(const std::uint8_t* data, std::size_t size);  // kvsim compare's CSV, cards

struct NamedTarget {
  const char* name;
  Target run;
};
const std::vector<NamedTarget>& all_targets();

// A file path for this process (overwritten on every input), removed when the input is done, so
// that neither the fuzzer nor the test suite's run of the targets leaves files behind.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& suffix);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kvsim::fuzz
