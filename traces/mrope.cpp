#include "traces/mrope.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvsim {

int mrope_axis(const std::vector<int>& section, int pair) {
  int end = 0;
  for (std::size_t a = 0; a < section.size(); ++a)
    if (pair < (end += section[a])) return static_cast<int>(a);
  throw std::logic_error("rotary pair " + std::to_string(pair) + " beyond the M-RoPE sections");
}

std::vector<int> qwen2vl_mrope_section(int head_dim) {
  const int pairs = head_dim / 2, temporal = head_dim / 8, height = 3 * head_dim / 16;
  return {temporal, height, pairs - temporal - height};
}

namespace {

// The grid rows of a frame of n tokens: the largest divisor of n up to sqrt(n).
int grid_rows(int n) {
  int rows = 1;
  for (int r = 1; static_cast<long>(r) * r <= n; ++r)
    if (n % r == 0) rows = r;
  return rows;
}

}  // namespace

std::vector<std::int32_t> qwen2vl_position_ids(const SampleInfo& s) {
  const int T = s.total_len();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(3) * T);
  auto set = [&](int pos, int t, int r, int c) {
    ids[pos] = t;
    ids[static_cast<std::size_t>(T) + pos] = r;
    ids[static_cast<std::size_t>(2) * T + pos] = c;
  };
  auto media = [&](int i) { return s.media_id.empty() ? (s.modality[i] ? 0 : -1) : s.media_id[i]; };
  int next = 0;  // one past the largest id so far
  for (int i = 0; i < T;) {
    if (s.modality[i] == static_cast<std::uint8_t>(Modality::kText)) {
      set(i, next, next, next);
      ++next, ++i;
      continue;
    }
    // One item: an image, or the consecutive frames of a video.
    const int start = next;
    int largest = start, step = 0;
    const bool video = s.modality[i] == static_cast<std::uint8_t>(Modality::kVideo);
    do {
      int end = i;
      while (end < T && s.modality[end] == s.modality[i] && media(end) == media(i)) ++end;
      const int n = end - i, rows = grid_rows(n), cols = n / rows;
      for (int u = 0; u < n; ++u) {
        set(i + u, start + step, start + u / cols, start + u % cols);
        largest = std::max({largest, start + step, start + u / cols, start + u % cols});
      }
      i = end, ++step;
    } while (video && i < T && s.modality[i] == static_cast<std::uint8_t>(Modality::kVideo));
    next = largest + 1;
  }
  return ids;
}

int next_rotary_position(const SampleInfo& sample, int prompt_len) {
  if (sample.position_ids.empty()) return prompt_len;
  const std::size_t T = static_cast<std::size_t>(sample.total_len());
  int largest = -1;
  for (std::size_t a = 0; a < 3; ++a)
    for (int i = 0; i < prompt_len; ++i)
      largest = std::max(largest, sample.position_ids[a * T + i]);
  return largest + 1;
}

}  // namespace kvsim
