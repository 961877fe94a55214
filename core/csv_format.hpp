// How kvsim writes CSV fields: numbers with %.9g (an exact float round trip; NaN is an empty
// field), so identical results give identical bytes; text quoted when it holds a comma, a quote
// or a newline (RFC 4180).
#pragma once

#include <string>

namespace kvsim {

void append_float(std::string& out, double x);
std::string csv_quote(const std::string& s);

}  // namespace kvsim
