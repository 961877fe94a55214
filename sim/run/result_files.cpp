#include "sim/run/result_files.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "core/partial_files.hpp"

namespace kvsim {

void check_writable(const std::string& path, const std::string& option) {
  std::FILE* f = std::fopen(partial(path).c_str(), "wb");
  if (!f)
    throw std::runtime_error(option + " " + path + ": cannot write there: " + std::strerror(errno));
  std::fclose(f);
  std::remove(partial(path).c_str());
}

void write_whole(const std::string& path, const std::string& text) {
  std::FILE* f = open_partial(path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(path + ": write failed (disk full?)");
  publish(path);
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const char* const kHeldFootnote =
    "held/B: peak entries held per (layer, KV head) over the budget; ! = more than 1% off it, not "
    "an equal-memory comparison (--equal-memory holds every budgeted policy to it)\n";

std::string held_over_budget_cell(double ratio, bool& flagged) {
  if (std::isnan(ratio)) return "-";
  const bool off = std::fabs(ratio - 1) > kHeldTolerance;
  flagged = flagged || off;
  char cell[32];
  std::snprintf(cell, sizeof cell, "%.2f%s", ratio, off ? "!" : "");
  return cell;
}

void append_file(std::FILE* to, const std::string& to_path, const std::string& from,
                 bool skip_header) {
  std::FILE* in = std::fopen(from.c_str(), "rb");
  if (!in) throw std::runtime_error(from + ": cannot open: " + std::strerror(errno));
  if (skip_header)
    for (int c = std::fgetc(in); c != EOF && c != '\n'; c = std::fgetc(in)) {
    }
  std::vector<char> buf(1 << 20);
  bool ok = true;
  for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), in)) > 0;)
    ok = ok && std::fwrite(buf.data(), 1, n, to) == n;
  const bool read_failed = std::ferror(in) != 0;
  std::fclose(in);
  if (read_failed) throw std::runtime_error(from + ": read failed");
  if (!ok) throw std::runtime_error(to_path + ": write failed (disk full?)");
}

}  // namespace kvsim
