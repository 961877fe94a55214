// downsample: the uniform-grid floor for vision tokens. VTC-Bench (visual token compression
// benchmark) finds that plain downsampling of the image matches or beats many published token
// compression methods; kvsim's analogue acts on the cache. At the end of the prefill the prompt's
// text is kept while the budget allows, and the rest of the budget keeps media tokens on a
// uniform grid: the media budget is shared by the images and video frames (media items) in
// proportion to their token counts, and within an item of an h x w patch grid the kept tokens are
// r rows by about m / r columns at the centres of equal cells (a 2-D stride); where no grid is
// known, every (n / m)-th token. No attention is read; every KV head keeps the same entries.
//
// The rule, for an item of n tokens keeping m of them (0 < m <= n):
//   grid h x w (n = h w): r = clamp(round(sqrt(m h / w)), ceil(m / w), min(h, m)) rows; row i of
//     r is floor((i + 1/2) h / r) and keeps c_i = floor(m / r) columns, one more in the first
//     m mod r rows; column j of c_i is floor((j + 1/2) w / c_i). 16 of an 8 x 8 grid: rows and
//     columns 1, 3, 5, 7 (stride 2).
//   no grid: tokens floor((j + 1/2) n / m), j = 0 .. m - 1.
// An item's grid is `grid` (H x W) when its token count is H W; under `grid = auto` a square
// count s^2 is an s x s grid (LLaVA-1.5's 24 x 24, the assembled VLM's 7 x 7); otherwise 1-D.
// Items are the sample's media_id groups, or, without media ids, runs of one non-text modality.
// The media budget goes to items by largest remainder (ties to the earlier item).
// When the text alone exceeds the budget, the newest text is kept and no media (a note says so).
// Decoding appends, as other prefill-only policies; under `decode = cap` the media entries go
// before the text, each oldest first (text keeps its priority over media).
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

struct Grid {
  int rows = 0, cols = 0;  // 0: none (1-D)
};

// "auto", "none" or "HxW".
Grid parse_grid(const std::string& text, bool& automatic) {
  automatic = text == "auto";
  if (automatic || text == "none") return {};
  const auto x = text.find('x');
  if (x != std::string::npos && x > 0 && x + 1 < text.size()) {
    const std::string rows = text.substr(0, x), cols = text.substr(x + 1);
    char* rows_end = nullptr;
    char* cols_end = nullptr;
    const long h = std::strtol(rows.c_str(), &rows_end, 10);
    const long w = std::strtol(cols.c_str(), &cols_end, 10);
    if (*rows_end == '\0' && *cols_end == '\0' && h >= 1 && w >= 1 && h <= (1 << 12) &&
        w <= (1 << 12))
      return {static_cast<int>(h), static_cast<int>(w)};
  }
  throw std::invalid_argument("is not auto, none or HxW (e.g. 24x24)");
}

// Indices (into an item of h x w tokens, row-major) of m tokens on a uniform 2-D grid.
std::vector<int> grid_pick(int h, int w, int m) {
  const int lo = (m + w - 1) / w, hi = std::min(h, m);
  const int r = std::clamp(static_cast<int>(std::lround(std::sqrt(double(m) * h / w))), lo, hi);
  std::vector<int> out;
  for (int i = 0; i < r; ++i) {
    const int row = static_cast<int>(std::floor((i + 0.5) * h / r));
    const int c = m / r + (i < m % r ? 1 : 0);
    for (int j = 0; j < c; ++j)
      out.push_back(row * w + static_cast<int>(std::floor((j + 0.5) * w / c)));
  }
  return out;
}

// Indices of m of n tokens, evenly spaced.
std::vector<int> stride_pick(int n, int m) {
  std::vector<int> out;
  for (int j = 0; j < m; ++j) out.push_back(static_cast<int>(std::floor((j + 0.5) * n / m)));
  return out;
}

// The prompt's media items: the positions of each, in order of their first position.
std::vector<std::vector<int>> media_items(const SampleInfo& s) {
  std::vector<std::vector<int>> items;
  std::map<std::int32_t, std::size_t> by_id;
  for (int j = 0; j < s.prompt_len; ++j) {
    if (s.modality[j] == static_cast<std::uint8_t>(Modality::kText)) continue;
    if (!s.media_id.empty()) {
      const auto [it, added] = by_id.emplace(s.media_id[j], items.size());
      if (added) items.emplace_back();
      items[it->second].push_back(j);
    } else {
      const bool joins = j > 0 && !items.empty() && items.back().back() == j - 1 &&
                         s.modality[j - 1] == s.modality[j];
      if (!joins) items.emplace_back();
      items.back().push_back(j);
    }
  }
  return items;
}

// Shares `total` over items of the given sizes in proportion, by largest remainder (ties to the
// earlier item); never more than an item holds.
std::vector<int> share_by_size(const std::vector<int>& sizes, long total) {
  long all = 0;
  for (int n : sizes) all += n;
  std::vector<int> out(sizes.size(), 0);
  if (all == 0) return out;
  total = std::min(total, all);
  std::vector<std::pair<double, int>> rest;
  long given = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double exact = double(total) * sizes[i] / double(all);
    out[i] = static_cast<int>(std::floor(exact));
    given += out[i];
    rest.push_back({exact - out[i], static_cast<int>(i)});
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < total && k < rest.size(); ++k, ++given) ++out[rest[k].second];
  return out;
}

class Downsample final : public Policy {
 public:
  Downsample(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "downsample")) {
    bool automatic = false;
    const Grid grid = parse_grid(p.get_string("grid"), automatic);
    keep_.assign(s.prompt_len, 0);
    priority_.assign(s.prompt_len, 0.0);
    if (budget_ >= s.prompt_len) {
      std::fill(keep_.begin(), keep_.end(), 1);
      return;
    }
    std::vector<int> text;
    for (int j = 0; j < s.prompt_len; ++j)
      if (s.modality[j] == static_cast<std::uint8_t>(Modality::kText)) text.push_back(j);
    const int text_kept = std::min<int>(budget_, text.size());
    for (std::size_t i = text.size() - text_kept; i < text.size(); ++i) {
      keep_[text[i]] = 1;
      priority_[text[i]] = 1.0;  // text outranks media under decode = cap
    }
    if (text_kept < static_cast<int>(text.size()))
      note("downsample: the prompt's " + std::to_string(text.size()) +
           " text entries exceed the budget of " + std::to_string(budget_) +
           ": the newest text is kept and no image or video entry");
    const auto items = media_items(s);
    std::vector<int> sizes;
    for (const auto& item : items) sizes.push_back(static_cast<int>(item.size()));
    const auto quota = share_by_size(sizes, budget_ - text_kept);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const int n = sizes[i], m = quota[i];
      if (m == 0) continue;
      Grid g = grid;
      if (automatic) {
        const int side = static_cast<int>(std::lround(std::sqrt(double(n))));
        if (side * side == n) g = {side, side};
      }
      const auto picked = g.rows * g.cols == n ? grid_pick(g.rows, g.cols, m) : stride_pick(n, m);
      for (int k : picked) keep_[items[i][k]] = 1;
    }
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    for (int g = 0; g < cache.kv_heads(); ++g)
      if (view.prompt_len() > budget_) cache.keep_only(g, keep_);
  }
  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
  const std::vector<double>* eviction_scores(int, int) const override { return &priority_; }

 private:
  int budget_;
  std::vector<std::uint8_t> keep_;  // [prompt position]
  std::vector<double> priority_;    // [prompt position]: 1 text, 0 media
};

ParamSpec grid_param() {
  ParamSpec spec{"grid", ParamType::kString, "auto",
                 "patch grid of an image or frame: auto (a square token count is a square grid, "
                 "others every k-th token), none (every k-th token) or HxW"};
  spec.check = [](const std::string& value) -> std::string {
    try {
      bool automatic = false;
      parse_grid(value, automatic);
      return "";
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  return spec;
}

const PolicyRegistration reg({
    .name = "downsample",
    .summary = "The grid floor: keeps the text, then image and video tokens on a uniform grid "
               "(2-D stride over a patch grid, every k-th token otherwise) up to the budget.",
    .provenance = "kvsim; the downsampling baseline of VTC-Bench, on cache entries",
    .params = {budget_param(), budget_rounding_param(false), grid_param()},
    .switches = {.decode = true, .question = true},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Downsample>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
