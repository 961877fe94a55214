#include "policies/scorers.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "policies/selection.hpp"

namespace kvsim {

std::vector<ParamSpec> snapkv_scoring_params() {
  return {{"window", ParamType::kInt, "32", "observation window: last prompt queries", 1, 1e9},
          {"kernel", ParamType::kInt, "7", "pooling size along positions (odd)", 1, 1e9},
          {"pooling", ParamType::kChoice, "max", "pooling kind", 0, 0, {"max", "avg"}},
          {"group_reduce",
           ParamType::kChoice,
           "mean",
           "GQA: the KV head's votes are the mean or the max over its query heads' votes "
           "(before pooling: the mean is Ada-KV's gqa_support, the max the gqa_func option of code "
           "derived from it)",
           0,
           0,
           {"mean", "max"}}};
}

SnapKVScoring read_snapkv_scoring(const ParamSet& p, const std::string& policy, int budget,
                                  int prompt_len) {
  SnapKVScoring s{static_cast<int>(p.get_int("window")), static_cast<int>(p.get_int("kernel")),
                  p.get_string("pooling") == "max", p.get_string("group_reduce") == "max", ""};
  if (s.kernel % 2 == 0)
    throw std::invalid_argument(policy + ": parameter 'kernel' = " + std::to_string(s.kernel) +
                                " must be odd (same padding)");
  if (budget <= s.window && budget < prompt_len) {
    s.clamped = policy + ": budget (" + std::to_string(budget) +
                " entries) does not exceed parameter 'window' = " + std::to_string(s.window) +
                ": window clamped to " + std::to_string(budget) + " (kvsim keeps the newest " +
                std::to_string(budget) +
                " prompt entries, its tie rule; kvpress scores the "
                "window entries equal and on a GPU keeps the oldest of them)";
    s.window = budget;
  }
  return s;
}

AttentionNeeds snapkv_needs(const ParamSet& p) {
  const int window = static_cast<int>(p.get_int("window"));
  // The mean's votes are one running sum over the group's rows (window_group_sums); the max needs
  // each head's.
  if (p.get_string("group_reduce") == "max") return AttentionNeeds{.prefill_window = window};
  return AttentionNeeds{.window_group_sums = {window}};
}

std::vector<double> snapkv_scores(const LayerView& view, int g, const SnapKVScoring& s) {
  const int group = view.group_size(), prefix = std::max(view.prompt_len() - s.window, 0);
  std::vector<double> score;
  if (!s.group_max) {
    // One running sum over (query head, window row), then the mean.
    score = view.window_group_sums(g, s.window);
    score.resize(prefix);
    for (auto& x : score) x /= group;
  } else {
    // Each head's votes, then their maximum.
    score.assign(prefix, 0.0);
    std::vector<double> votes(prefix);
    for (int r = 0; r < group; ++r) {
      std::fill(votes.begin(), votes.end(), 0.0);
      for (int w = 0; w < s.window; ++w) {
        const float* row =
            view.prefill_window_row(g * group + r, view.prefill_window() - s.window + w);
        for (int j = 0; j < prefix; ++j) votes[j] += row[j];
      }
      for (int j = 0; j < prefix; ++j) score[j] = std::max(score[j], votes[j]);
    }
  }
  return s.max_pool ? pool_max(score, s.kernel) : pool_avg(score, s.kernel);
}

std::vector<std::vector<double>> snapkv_prompt_scores(const LayerView& view,
                                                      const SnapKVScoring& s) {
  std::vector<std::vector<double>> scores(view.num_kv_heads());
  for (int g = 0; g < view.num_kv_heads(); ++g) {
    scores[g] = snapkv_scores(view, g, s);
    scores[g].resize(view.prompt_len(), kUnscored);
  }
  return scores;
}

std::vector<double> prompt_column_scores(const LayerView& view, int g) {
  const int group = view.group_size();
  std::vector<double> score(view.prompt_len(), 0.0);
  for (int r = 0; r < group; ++r) {
    const float* col = view.prefill_column_sums(g * group + r);
    for (int j = 0; j < view.prompt_len(); ++j) score[j] += col[j];
  }
  return score;
}

std::vector<double> key_norm_scores(const LayerView& view, int g) {
  const int d = view.head_dim();
  std::vector<double> score(view.prompt_len());
  for (int j = 0; j < view.prompt_len(); ++j) {
    const float* k = view.key(j, g);
    double norm2 = 0;
    for (int c = 0; c < d; ++c) norm2 += double(k[c]) * k[c];
    score[j] = -std::sqrt(norm2);
  }
  return score;
}

std::vector<double> last_token_attention(const LayerView& view) {
  return view.last_row_head_mean();
}

}  // namespace kvsim
