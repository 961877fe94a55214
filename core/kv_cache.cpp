#include "core/kv_cache.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvsim {

KvCache::KvCache(int kv_heads, int head_dim) : heads_(kv_heads), d_(head_dim) {}

const float* KvCache::merged_key(int g, int e) const {
  const int s = heads_[g].slot[e];
  return s < 0 ? nullptr : &heads_[g].kv[static_cast<std::size_t>(s) * 2 * d_];
}

const float* KvCache::merged_value(int g, int e) const {
  const int s = heads_[g].slot[e];
  return s < 0 ? nullptr : &heads_[g].kv[(static_cast<std::size_t>(s) * 2 + 1) * d_];
}

void KvCache::fill_prompt(int prompt_len) {
  for (auto& h : heads_) {
    h = Head{};
    h.positions.resize(prompt_len);
    for (int i = 0; i < prompt_len; ++i) h.positions[i] = i;
    h.attended.assign(prompt_len, 1);
    h.attended_count = prompt_len;
    h.slot.assign(prompt_len, -1);
  }
}

void KvCache::append(int g, std::int32_t position) {
  auto& h = heads_[g];
  if (!h.positions.empty() && h.positions.back() >= position)
    throw std::logic_error("KvCache::append: position " + std::to_string(position) +
                           " is not newer than every cached entry");
  h.positions.push_back(position);
  h.attended.push_back(1);
  ++h.attended_count;
  h.slot.push_back(-1);
}

void KvCache::remove(int g, const std::vector<int>& dropped, bool log) {
  auto& h = heads_[g];
  const std::size_t n = h.positions.size();
  // Entries before the first dropped one stay where they are; each run of kept entries after a
  // dropped one moves down once (a decode step's single eviction is one memmove per array).
  std::size_t out = dropped.empty() ? n : static_cast<std::size_t>(dropped.front());
  for (std::size_t k = 0; k < dropped.size(); ++k) {
    const std::size_t e = dropped[k], run_end = k + 1 < dropped.size() ? dropped[k + 1] : n;
    if (log) h.evicted.push_back({step_, h.positions[e]});
    if (h.slot[e] >= 0) --h.merged_count;  // its slot's storage is simply abandoned
    h.attended_count -= h.attended[e];
    auto move_run = [&](auto& v) {
      std::move(v.begin() + e + 1, v.begin() + run_end, v.begin() + out);
    };
    move_run(h.positions);
    move_run(h.attended);
    move_run(h.slot);
    out += run_end - e - 1;
  }
  h.positions.resize(out);
  h.attended.resize(out);
  h.slot.resize(out);
}

void KvCache::evict(int g, std::span<const int> entries) {
  std::vector<int> dropped(entries.begin(), entries.end());
  std::sort(dropped.begin(), dropped.end());
  for (std::size_t k = 0; k < dropped.size(); ++k)
    if (dropped[k] < 0 || dropped[k] >= size(g) || (k > 0 && dropped[k] == dropped[k - 1]))
      throw std::logic_error("KvCache::evict: entry " + std::to_string(dropped[k]) +
                             " is out of range or listed twice");
  remove(g, dropped, true);
}

void KvCache::keep_only(int g, const std::vector<std::uint8_t>& keep) {
  if (keep.size() != heads_[g].positions.size())
    throw std::logic_error("KvCache::keep_only: mask size does not match the cache");
  std::vector<int> dropped;
  for (std::size_t e = 0; e < keep.size(); ++e)
    if (!keep[e]) dropped.push_back(static_cast<int>(e));
  remove(g, dropped, true);
}

void KvCache::evict_positions_if(const std::function<bool(std::int32_t)>& drop) {
  for (int g = 0; g < kv_heads(); ++g) {
    std::vector<int> dropped;
    for (int e = 0; e < size(g); ++e)
      if (drop(position(g, e))) dropped.push_back(e);
    remove(g, dropped, true);
  }
}

void KvCache::set_attended(int g, int e, bool attended) {
  auto& h = heads_[g];
  h.attended_count += static_cast<int>(attended) - h.attended.at(e);
  h.attended[e] = attended;
}

void KvCache::merge(int g, int from, int into, const float* key, const float* value) {
  auto& h = heads_[g];
  if (from == into || from < 0 || into < 0 || from >= size(g) || into >= size(g))
    throw std::logic_error("KvCache::merge: bad entries");
  if (h.slot[into] < 0) {
    h.slot[into] = static_cast<int>(h.kv.size() / (2 * d_));
    h.kv.resize(h.kv.size() + 2 * d_);
    ++h.merged_count;
  }
  float* dst = &h.kv[static_cast<std::size_t>(h.slot[into]) * 2 * d_];
  std::copy(key, key + d_, dst);
  std::copy(value, value + d_, dst + d_);
  h.merged.push_back({step_, h.positions[from], h.positions[into]});
  remove(g, {from}, false);
}

void KvCache::check_invariants(int g) const {
  const auto& p = heads_[g].positions;
  for (std::size_t e = 1; e < p.size(); ++e)
    if (p[e - 1] >= p[e])
      throw std::logic_error("KV cache head " + std::to_string(g) +
                             ": positions not strictly increasing at entry " + std::to_string(e));
}

}  // namespace kvsim
