#include "core/csv_format.hpp"

#include <charconv>
#include <cmath>

namespace kvsim {

void append_float(std::string& out, double x) {
  if (std::isnan(x)) return;  // empty field
  // The characters of printf's "%.9g" (the standard defines to_chars with a precision so), at a
  // fraction of its cost: the per-step CSV holds millions of numbers.
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::general, 9).ptr;
  out.append(buf, end);
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace kvsim
