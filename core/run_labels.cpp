#include "core/run_labels.hpp"

#include <algorithm>

namespace kvsim {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// NAME[a=1,seed=K,b=2] -> NAME[a=1,b=2]; "" when the label has no seed axis.
std::string without_seed_axis(const std::string& label) {
  const auto open = label.find('[');
  if (open == std::string::npos || label.back() != ']') return "";
  const std::string inner = label.substr(open + 1, label.size() - open - 2);
  std::string kept, item;
  bool found = false;
  for (std::size_t start = 0; start <= inner.size();) {
    const auto comma = std::min(inner.find(',', start), inner.size());
    item = inner.substr(start, comma - start);
    if (item.rfind("seed=", 0) == 0 && all_digits(item.substr(5)))
      found = true;
    else
      kept += (kept.empty() ? "" : ",") + item;
    start = comma + 1;
  }
  if (!found) return "";
  return label.substr(0, open) + (kept.empty() ? "" : "[" + kept + "]");
}

}  // namespace

std::string seeded_label(const std::string& name, int seed) {
  return name + (name.find('@') == std::string::npos ? "@seed" : "-seed") + std::to_string(seed);
}

std::string seed_group_text(const std::string& name, int runs) {
  return runs > 1 ? name + " (" + std::to_string(runs) + " seeds)" : name;
}

std::string seed_group_of(const std::string& label) {
  if (const std::string sweep = without_seed_axis(label); !sweep.empty()) return sweep;
  const auto at = label.find('@');
  if (at == std::string::npos) return "";
  for (const std::string mark : {"@seed", "-seed"}) {
    const auto m = label.rfind(mark);
    if (m == std::string::npos || m < at) continue;
    if (all_digits(label.substr(m + mark.size()))) return label.substr(0, m);
  }
  return "";
}

}  // namespace kvsim
