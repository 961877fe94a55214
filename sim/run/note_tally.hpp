// What policies noted at run time (Policy::notes, e.g. MadaKV's "the budget ran dry at layer 10"),
// each distinct note of a policy once with the number of samples that gave it: the words replay,
// sweep, live and Python report alike.
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kvsim {

// A note as one line of a state or item file (newlines become spaces).
inline std::string note_on_one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

class NoteTally {
 public:
  // Policy `policy` noted `text` on sample `sample` (a sample counts once per note).
  void add(int policy, const std::string& sample, const std::string& text) {
    if (!seen_.insert({policy, sample + '\n' + text}).second) return;
    for (auto& e : entries_)
      if (e.policy == policy && e.text == text) {
        ++e.samples;
        return;
      }
    entries_.push_back({policy, text, 1});
  }
  // "TEXT (K of N sample(s))" per distinct note with its policy index, by policy, then in the
  // order first noted.
  std::vector<std::pair<int, std::string>> lines(std::size_t samples) const {
    std::vector<std::pair<int, std::string>> out;
    for (const auto& e : entries_)
      out.emplace_back(e.policy, e.text + " (" + std::to_string(e.samples) + " of " +
                                     std::to_string(samples) + " sample(s))");
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  }

 private:
  struct Entry {
    int policy;
    std::string text;
    int samples;
  };
  std::vector<Entry> entries_;
  std::set<std::pair<int, std::string>> seen_;
};

}  // namespace kvsim
