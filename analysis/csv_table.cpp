#include "analysis/csv_table.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace kvsim {

int CsvTable::column(const std::string& name) const {
  for (std::size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<std::string> CsvTable::strings(const std::string& name) const {
  const int c = column(name);
  if (c < 0) {
    std::string have;
    for (const auto& h : header) have += (have.empty() ? "" : ", ") + h;
    throw std::invalid_argument(path + ": no column '" + name + "' (it has: " + have + ")");
  }
  std::vector<std::string> out;
  out.reserve(rows.size());
  for (const auto& r : rows) out.push_back(r[c]);
  return out;
}

std::vector<double> CsvTable::numbers(const std::string& name) const {
  const std::vector<std::string> text = strings(name);
  std::vector<double> out(text.size(), NAN);
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i].empty()) continue;
    char* end = nullptr;
    out[i] = std::strtod(text[i].c_str(), &end);
    if (*end != '\0')
      throw std::invalid_argument(path + ": line " + std::to_string(i + 2) + ", column '" + name +
                                  "': '" + text[i] + "' is not a number");
  }
  return out;
}

CsvTable parse_csv_table(const std::string& text, const std::string& path) {
  CsvTable t;
  t.path = path;
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false, any = false;
  int line = 1, row_line = 1;
  auto end_row = [&] {
    fields.push_back(field);
    field.clear();
    if (t.header.empty()) {
      t.header = fields;
    } else if (fields.size() != t.header.size()) {
      throw std::invalid_argument(path + ": line " + std::to_string(row_line) + " has " +
                                  std::to_string(fields.size()) + " fields, the header " +
                                  std::to_string(t.header.size()));
    } else {
      t.rows.push_back(fields);
    }
    fields.clear();
    any = false;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (c == '"' && field.empty()) {
      quoted = any = true;
    } else if (c == ',') {
      fields.push_back(field);
      field.clear();
      any = true;
    } else if (c == '\n') {
      if (any || !field.empty()) end_row();
      row_line = ++line;
    } else if (c != '\r') {
      field += c;
      any = true;
    }
  }
  if (quoted)
    throw std::invalid_argument(path + ": a quote opened on line " + std::to_string(row_line) +
                                " is never closed");
  if (any || !field.empty()) end_row();
  if (t.header.empty()) throw std::invalid_argument(path + ": empty file (no header)");
  return t;
}

CsvTable read_csv_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  return parse_csv_table(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

}  // namespace kvsim
