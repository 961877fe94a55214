// What an existing file on disk is, as far as kvsim's own formats go: the output guard
// (sim/run/output_guard.hpp) asks before it lets a command write over it.
#pragma once

#include <string>

namespace kvsim {

enum class FileKind {
  missing,        // nothing at that path
  trace,          // kvtrace v1 (a `kvtrace_version` attribute on '/'), full
  compact_trace,  // kvtrace v1 with `kvtrace_compact` (kvtrace-v1.md, "Compact traces")
  prompts,        // kvprompt v1 (a `kvprompt_version` attribute on '/')
  other_hdf5,     // an HDF5 file of another kind (e.g. --dump-decisions, kvsim stats)
  directory,
  other,  // any other file (a CSV, a PNG, ...)
};

// Reads at most the HDF5 superblock and the root's attributes; never throws.
FileKind file_kind(const std::string& path);
// "kvtrace file", "compact kvtrace file", "kvprompt file", ...: for messages.
const char* describe(FileKind kind);

}  // namespace kvsim
