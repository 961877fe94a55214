// adakv: Ada-KV head-adaptive budget allocation (Feng et al. 2024, Sec. 3-4, Algorithm 1) around
// any of kvsim's prompt scorers (`scorer`: SnapKV's window votes by default, H2O's column sums,
// kvpress's key norms or expected attention; policies/scorers.hpp), as kvpress's AdaKVPress wraps
// any ScorerPress: within a layer the KV heads share Hkv · B entries. Each head keeps its
// observation window (the last w prompt entries, unscored; w = 0 scores every entry, as kvpress
// does around scorers without a window) and at least floor(α · (B - w)) of its own best entries;
// the remaining Hkv · (B - w) - Hkv · floor(α · (B - w)) go to the highest scores across all heads
// jointly. GQA-aware: a KV head's score is the mean over its query heads (SnapKV, expected
// attention) or their sum (h2o scorer). `safeguard = kvpress` is kvpress's AdaKVPress
// (kvpress/presses/adakv_press.py): each head keeps its int(α · B) best entries, the window (which
// SnapKVPress scores with the maximum) among them, so its own prefix floor is max(0, int(α · B) -
// w); the rest is the same joint top-k. `safeguard = authors` is FFY0/AdaKV's allocation
// (adaptive_snapkv/monkeypatch/ snapkv_utils.py, AdaptiveSnapKVCluster), which KVCache-Factory's
// AdaKVCluster copies (see authors_keep); both keep a cache per query head unless told otherwise
// (`caches`). Decoding appends without eviction (`decode` changes that: policies/decode_mode.cpp).
// Ties keep the newer position, then the lower head.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <tuple>

#include "policies/scorer_policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

// SnapKV's parameters with a window that may be 0 (the other scorers need none).
std::vector<ParamSpec> window_optional(std::vector<ParamSpec> specs) {
  for (auto& s : specs)
    if (s.name == "window") {
      s.min = 0;
      s.doc += "; 0: none (not with the snapkv scorer)";
    }
  return specs;
}

// How the layer's KV heads share Hkv · B entries: the observation window w, α, the safeguard
// (kvsim's prefix reading, kvpress's, or the authors'), and the authors' normalisation.
struct AdaKVSelection {
  int budget = 0, window = 0;
  double alpha = 0;
  bool kvpress = false, authors = false, normalize = false;
};

using Candidate = std::tuple<double, int, int>;  // score, position, head
// Higher score first, then the newer position, then the lower head.
bool better(const Candidate& a, const Candidate& b) {
  if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
  if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) > std::get<1>(b);
  return std::get<2>(a) < std::get<2>(b);
}
// The first k of `pool` by `better` (all of it when shorter), in no particular order.
void best_first(std::vector<Candidate>& pool, std::size_t k) {
  if (k < pool.size()) std::nth_element(pool.begin(), pool.begin() + k, pool.end(), better);
  pool.resize(std::min(k, pool.size()));
}

// prefix / kvpress: each head's floor of its own best, the rest of Hkv (B - w) jointly.
// `scores`: [kv head][prefix position].
std::vector<std::vector<std::uint8_t>> floor_and_joint_keep(const PromptScores& scores, int prefix,
                                                            const AdaKVSelection& s) {
  const int heads = static_cast<int>(scores.size()), w = s.window, per_head = s.budget - w;
  const int floor_n = s.kvpress ? std::max(0, static_cast<int>(s.alpha * s.budget) - w)
                                : static_cast<int>(std::floor(s.alpha * per_head));
  std::vector<std::vector<std::uint8_t>> keep(heads);
  std::vector<Candidate> pool;
  for (int g = 0; g < heads; ++g) {
    keep[g] = keep_top_scores(scores[g], floor_n);  // the per-head floor
    keep[g].resize(prefix + w, 1);                  // the window
    for (int j = 0; j < prefix; ++j)
      if (!keep[g][j]) pool.emplace_back(scores[g][j], j, g);
  }
  best_first(pool, static_cast<std::size_t>(heads) * (per_head - floor_n));
  for (const auto& c : pool) keep[std::get<2>(c)][std::get<1>(c)] = 1;
  return keep;
}

// authors (FFY0/AdaKV, as KVCache-Factory's AdaKVCluster adapts it): the joint top Hkv (B - w)
// of the scores, each head's scaled by the share of its mass in its own top B - w when
// `normalize`, count c_h per head; head h keeps its round(c_h (1 - α) + int(α (B - w))) best
// (torch.round: half to even) and the window. Prompts whose prefix is shorter than B - w keep
// everything. `scores`: [kv head][prefix position].
std::vector<std::vector<std::uint8_t>> authors_keep(const PromptScores& scores, int prefix,
                                                    const AdaKVSelection& s) {
  const int heads = static_cast<int>(scores.size()), w = s.window, base = s.budget - w;
  std::vector<std::vector<std::uint8_t>> keep(heads);
  if (base > prefix) {
    for (auto& k : keep) k.assign(prefix + w, 1);
    return keep;
  }
  std::vector<Candidate> pool;
  for (int g = 0; g < heads; ++g) {
    double weight = 1;
    if (s.normalize) {
      std::vector<double> sorted = scores[g];
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const double top = std::accumulate(sorted.begin(), sorted.begin() + base, 0.0);
      const double all = std::accumulate(sorted.begin(), sorted.end(), 0.0);
      weight = all > 0 ? top / all : 1;
    }
    for (int j = 0; j < prefix; ++j) pool.emplace_back(scores[g][j] * weight, j, g);
  }
  best_first(pool, static_cast<std::size_t>(heads) * base);
  std::vector<int> count(heads, 0);
  for (const auto& c : pool) ++count[std::get<2>(c)];
  const int floor_n = static_cast<int>(base * s.alpha);
  for (int g = 0; g < heads; ++g) {
    const int n = static_cast<int>(std::nearbyint(count[g] * (1 - s.alpha) + floor_n));
    keep[g] = keep_top_scores(scores[g], std::min(n, prefix));
    keep[g].resize(prefix + w, 1);
  }
  return keep;
}

// The chosen scorer's scores of every prompt entry, the window's kUnscored (kept, no score).
PromptScores adakv_scores(const LayerView& view, const std::string& scorer,
                          const SnapKVScoring& scoring, const ExpectedAttentionScoring& expected) {
  const int P = view.prompt_len(), heads = view.num_kv_heads();
  PromptScores scores;
  if (scorer == "expected_attention") {
    scores = expected_attention_scores(view, expected, "adakv");
  } else {
    scores.resize(heads);
    for (int g = 0; g < heads; ++g)
      scores[g] = scorer == "h2o"     ? prompt_column_scores(view, g)
                  : scorer == "knorm" ? key_norm_scores(view, g)
                                      : snapkv_scores(view, g, scoring);
  }
  for (auto& s : scores) {
    s.resize(P - scoring.window);
    s.resize(P, kUnscored);
  }
  return scores;
}

PromptScorer make_adakv(const ParamSet& p, const SampleInfo& sample, int budget) {
  const std::string scorer = p.get_string("scorer");
  const SnapKVScoring scoring = read_snapkv_scoring(p, "adakv", budget, sample.prompt_len);
  if (scorer == "snapkv" && scoring.window < 1)
    throw std::invalid_argument(
        "adakv: parameter 'window' = 0 leaves the snapkv scorer no observation window");
  const AdaKVSelection selection{.budget = budget,
                                 .window = scoring.window,
                                 .alpha = p.get_float("alpha"),
                                 .kvpress = p.get_string("safeguard") == "kvpress",
                                 .authors = p.get_string("safeguard") == "authors",
                                 .normalize = p.get_bool("normalize")};
  PromptScorer out;
  out.score = [scorer, scoring, expected = read_expected_attention(p)](const LayerView& view) {
    return adakv_scores(view, scorer, scoring, expected);
  };
  // The selection sees each head's prefix (the window is kept whole).
  out.select = [selection](const PromptScores& scores, int) {
    const int prefix = static_cast<int>(scores.front().size()) - selection.window;
    PromptScores prefixes;
    for (const auto& s : scores) prefixes.emplace_back(s.begin(), s.begin() + prefix);
    return selection.authors ? authors_keep(prefixes, prefix, selection)
                             : floor_and_joint_keep(prefixes, prefix, selection);
  };
  if (!scoring.clamped.empty()) out.notes.push_back(scoring.clamped);
  return out;
}

const PolicyRegistration reg(scorer_policy(
    {
        .name = "adakv",
        .summary =
            "Head-adaptive selection: the layer's KV heads share Hkv x B entries, with a floor "
            "of alpha per head, around a prompt scorer.",
        .provenance = "Feng et al. 2024, Ada-KV, Sec. 3-4 / Algorithm 1 (alpha = 0.2)",
        .params = concat(
            {
                budget_param(),
                budget_rounding_param(false),
                {"alpha", ParamType::kFloat, "0.2", "per-head floor, share of B - window", 0, 1},
                {"safeguard",
                 ParamType::kChoice,
                 "prefix",
                 "prefix (each head's floor(alpha (B - w)) best prefix entries, kvsim's reading of "
                 "Alg. 1), kvpress (its int(alpha B) best, window included, as AdaKVPress) or "
                 "authors (round((1 - alpha) c_h + int(alpha (B - w))) per head from its share c_h "
                 "of the joint top-k, as FFY0/AdaKV)",
                 0,
                 0,
                 {"prefix", "kvpress", "authors"}},
                {"normalize", ParamType::kBool, "false",
                 "safeguard = authors: scale each head's scores by the share of its mass in its "
                 "own top B - w before the joint top-k (the authors' normalize)"},
                {"scorer",
                 ParamType::kChoice,
                 "snapkv",
                 "snapkv (window votes, pooled), h2o (prompt column sums), knorm (-|k|, as "
                 "KnormPress) or expected_attention (as ExpectedAttentionPress; its parameters "
                 "below)",
                 0,
                 0,
                 {"snapkv", "h2o", "knorm", "expected_attention"}},
            },
            concat(window_optional(snapkv_scoring_params()), expected_attention_params())),
        .switches = {.decode = true, .caches = true, .question = true},
        .needs_for =
            [](const ParamSet& p) {
              AttentionNeeds n;
              if (p.get_string("scorer") == "snapkv") n = snapkv_needs(p);
              n.prefill_column_sums = p.get_string("scorer") == "h2o";
              n.prompt_queries = p.get_string("scorer") == "expected_attention";
              return n;
            },
    },
    make_adakv));

}  // namespace
}  // namespace kvsim
