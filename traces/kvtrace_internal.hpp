// Checks shared by the kvtrace reader's files (traces/kvtrace.cpp, traces/kvtrace_compact.cpp).
#pragma once

#include <string>
#include <vector>

#include "traces/hdf5_util.hpp"

namespace kvsim::detail {

// "[2, 3, 4]"
std::string shape_str(const std::vector<hsize_t>& s);
// kvtrace v1 allows gzip and shuffle only; throws TraceError prefixed by `where`.
void check_filters(hid_t dset, const std::string& where);
// An integer attribute in 1..2^30 (0..2^30 with allow_zero); throws naming it.
int require_positive_int(hid_t obj, const char* name, const std::string& where, bool allow_zero);

}  // namespace kvsim::detail
