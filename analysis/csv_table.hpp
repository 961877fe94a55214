// Reading kvsim's own result tables back (RFC 4180 CSV: quoted fields may hold commas, quotes and
// newlines), for commands that analyse results: `kvsim compare`.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kvsim {

struct CsvTable {
  std::string path;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  // The index of a column, or -1.
  int column(const std::string& name) const;
  // The column's values; throws std::invalid_argument naming the file, the column and the
  // columns it has when there is none.
  std::vector<std::string> strings(const std::string& name) const;
  // Numbers; an empty field is NaN. Throws naming the file, line and column on anything else.
  std::vector<double> numbers(const std::string& name) const;
};

// Throws std::runtime_error naming the path when the file cannot be read, and
// std::invalid_argument naming the path and line when a row is malformed (an unclosed quote, a
// row with another number of fields than the header).
CsvTable read_csv_table(const std::string& path);
CsvTable parse_csv_table(const std::string& text, const std::string& path);

}  // namespace kvsim
