#include "sim/run/output_guard.hpp"

#include <filesystem>
#include <system_error>

#include "sim/run/result_files.hpp"
#include "traces/file_kind.hpp"

namespace kvsim {

namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec) && !ec;
}

namespace {

std::string named(const OutputPath& o) {
  return o.option + " " + o.path;
}

// Whether an output of `kind` may replace the `existing` trace or prompt file (with --force).
bool replaceable_with_force(FileKind existing, OutputKind kind) {
  const bool trace = existing == FileKind::trace || existing == FileKind::compact_trace;
  return (kind == OutputKind::trace && trace) ||
         (kind == OutputKind::prompts && existing == FileKind::prompts);
}

void check_existing(const OutputPath& o, bool force) {
  const FileKind existing = file_kind(o.path);
  if (existing == FileKind::directory)
    throw OutputConflict(named(o) + ": is a directory; give a file name");
  if (existing != FileKind::trace && existing != FileKind::compact_trace &&
      existing != FileKind::prompts)
    return;
  if (replaceable_with_force(existing, o.kind)) {
    if (force) return;
    throw OutputConflict(
        named(o) + ": an existing " + describe(existing) +
        " is there; kvsim replaces it only when told to (--force; force=True in Python)");
  }
  throw OutputConflict(named(o) + ": an existing " + describe(existing) +
                       " is there and this output is not one; choose another name");
}

}  // namespace

void check_outputs(const std::vector<OutputPath>& outputs, const std::vector<InputPath>& inputs,
                   bool force) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const OutputPath& o = outputs[i];
    if (o.path.empty()) continue;
    for (const InputPath& in : inputs)
      if (!in.path.empty() && same_file(o.path, in.path))
        throw OutputConflict(named(o) + ": is the input " + in.role + " " + in.path +
                             "; kvsim never writes over its inputs: choose another name");
    for (std::size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && same_file(o.path, outputs[j].path))
        throw OutputConflict(named(o) + ": is also " + named(outputs[j]) +
                             "; give each output its own name");
    check_existing(o, force);
  }
  for (const OutputPath& o : outputs)
    if (!o.path.empty()) check_writable(o.path, o.option);
}

}  // namespace kvsim
