// No command writes over its inputs: every output path is checked, before any work, against every
// input (the same file by path or by inode), against the other outputs, and against what already
// lies there (a trace or prompt file is replaced only by one of its kind, and then only with
// --force). Outputs are then written through `<path>.partial` and a rename (partial_files.hpp), so
// a failed run leaves the old file as it was.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace kvsim {

// What an output will hold: a trace (kvtrace, full or compact), a prompt file (kvprompt), or a
// result of any other kind (a CSV, a decisions or statistics HDF5 file).
enum class OutputKind { result, trace, prompts };

struct OutputPath {
  std::string path;
  std::string option;  // how the user gave it: "--summary", "-o", "OUT"
  OutputKind kind = OutputKind::result;
};

struct InputPath {
  std::string path;
  std::string role;  // what it is to the command: "trace", "prompt file", "config"
};

// What check_outputs throws when an output is in the way of an input, another output or an
// existing trace or prompt file (Python: FileExistsError).
class OutputConflict : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws OutputConflict naming the output's option and path and what is in the way: an input,
// another output, or an existing trace or prompt file (then saying whether --force would let it be
// replaced). Empty paths are skipped. Then checks every output can be written (check_writable,
// which throws std::runtime_error).
void check_outputs(const std::vector<OutputPath>& outputs, const std::vector<InputPath>& inputs,
                   bool force = false);

// True when `a` and `b` name one file: the same inode when both exist, else the same normalised
// path.
bool same_file(const std::string& a, const std::string& b);

}  // namespace kvsim
