// Helpers every result file shares: written whole through `<path>.partial` and a rename, read
// whole with an error naming the path, checked writable before any work, appended from a part;
// and the held-over-budget cell every result table prints.
#pragma once

#include <cstdio>
#include <string>

namespace kvsim {

// Every result file is written to `<path>.partial` and renamed when complete (partial, publish:
// core/partial_files.hpp), so an interrupted run never leaves a truncated file under the final
// name.
// Fails at once, before any work, when `path` (given with `option`, e.g. "--summary") cannot be
// written: the error names the user's path and the operating system's reason.
void check_writable(const std::string& path, const std::string& option);
void write_whole(const std::string& path, const std::string& text);  // via .partial
std::string read_whole(const std::string& path);                     // throws naming the path

// A table's held/B cell: the peak entries held per (layer, KV head) over the budget, "1.00", or
// "1.32!" when more than kHeldTolerance off it (and then `flagged` is set), "-" without a budget.
// Every table that prints one ends with kHeldFootnote when a cell was flagged.
inline constexpr double kHeldTolerance = 0.01;
std::string held_over_budget_cell(double ratio, bool& flagged);
extern const char* const kHeldFootnote;

// Appends the file `from` to `to`, leaving out its first line when `skip_header`; throws naming
// `to_path` when writing fails.
void append_file(std::FILE* to, const std::string& to_path, const std::string& from,
                 bool skip_header);

}  // namespace kvsim
