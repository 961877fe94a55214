// Named parameter sets that pin what one reference repository or paper means by a method's name.
// `--policy snapkv:kvpress` replays `snapkv` with these values (user --set still applies on top);
// results record the label and the fully resolved parameters.
#include "policies/policy.hpp"

namespace kvsim {

const std::vector<PolicyPreset>& policy_presets() {
  static const std::vector<PolicyPreset> presets = {
      {"snapkv:original",
       "snapkv",
       {{"window", "32"}, {"kernel", "7"}, {"pooling", "max"}, {"caches", "query_head"}},
       "FasterDecoding/SnapKV experiments/LongBench: pred_snap.py sets each layer's window_size, "
       "kernel_size and pooling from --compress_args_path, and scripts/run_longbench.sh runs "
       "ablation_c4096_w32_k7_maxpool.json, the repository's only published LongBench "
       "configuration (window 32, kernel 7, maxpool; capacities 1024-4096); snapkv_utils.py "
       "SnapKVCluster pools with F.max_pool1d(kernel, padding kernel // 2, stride 1); "
       "mistral_hijack_4_37.py repeats K and V per query head before update_kv",
       "window 32, max-pool 7 (the published LongBench runs), window votes summed, one cache per "
       "query head"},
      {"snapkv:quickstart",
       "snapkv",
       {{"window", "32"}, {"kernel", "5"}, {"pooling", "avg"}, {"caches", "query_head"}},
       "FasterDecoding/SnapKV snapkv/monkeypatch/snapkv_utils.py, init_snapkv (the config "
       "defaults a model gets without compress args, as in the README's quick start: "
       "window_size 32, kernel_size 5, avgpool); mistral_hijack_4_37.py repeats K and V per "
       "query head before update_kv (\"[SnapKV] move to ahead\")",
       "window 32, average-pool 5 (init_snapkv's defaults), window votes summed, one cache per "
       "query head"},
      {"snapkv:kvpress",
       "snapkv",
       {{"budget_rounding", "kvpress"},
        {"window", "64"},
        {"kernel", "5"},
        {"pooling", "avg"},
        {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/snapkv_press.py (SnapKVPress); kvpress/pipeline.py "
       "compresses the context "
       "and appends the question uncompressed",
       "window 64, average-pool 5, window votes averaged (ranks exactly as the sum)"},
      {"snapkv:kvcache-factory",
       "snapkv",
       {{"budget_rounding", "round"},
        {"window", "8"},
        {"kernel", "7"},
        {"pooling", "max"},
        {"caches", "query_head"}},
       "Zefan-Cai/KVCache-Factory run_longbench.py (window_sizes = 8, kernel_sizes = 7, maxpool) + "
       "pyramidkv/pyramidkv_utils.py SnapKVCluster; pyramidkv/llama_model.py calls update_kv "
       "after repeat_kv",
       "window 8, max-pool 7, window votes summed, one cache per query head"},
      {"h2o:paper",
       "h2o",
       {{"budget_rounding", "parts"}, {"mode", "cumulative"}, {"recent", "50%"}},
       "Zhang et al. 2023, H2O, Algorithm 1; FMInference/H2O h2o_hf/utils_lm_eval/modify_llama.py "
       "sizes heavy_budget and recent_budget as int(ratio * P) each (budget_rounding = parts)",
       "per-step cumulative attention, half of the budget recent"},
      {"h2o:kvcache-factory",
       "h2o",
       {{"budget_rounding", "round"},
        {"mode", "oneshot"},
        {"recent", "8"},
        {"caches", "query_head"}},
       "Zefan-Cai/KVCache-Factory pyramidkv/pyramidkv_utils.py H2OKVCluster (column sums of the "
       "causal prompt attention, the window kept) + run_longbench.py (window_sizes = 8); its 2024 "
       "version masked only the last window block, so its scores saw future tokens: this preset "
       "follows the corrected, causal code; update_kv runs after repeat_kv (llama_model.py)",
       "prompt column sums at the prefill only, the 8 newest kept, then append, one cache per "
       "query head"},
      {"h2o:kvpress",
       "h2o",
       {{"budget_rounding", "kvpress"},
        {"mode", "oneshot"},
        {"recent", "0"},
        {"normalize", "queries"},
        {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/observed_attention_press.py (ObservedAttentionPress); "
       "kvpress/pipeline.py compresses the context "
       "and appends the question uncompressed",
       "prompt attention received per query that could see the token, once, no window, then "
       "append"},
      {"streamingllm:paper",
       "streamingllm",
       {{"sinks", "4"}},
       "Xiao et al. 2024, StreamingLLM, Sec. 3.2",
       "4 attention sinks + recent window, after every step"},
      {"streamingllm:kvpress",
       "streamingllm",
       {{"budget_rounding", "kvpress"},
        {"sinks", "4"},
        {"compress", "prefill"},
        {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/streaming_llm_press.py (n_sink = 4); kvpress/pipeline.py "
       "compresses the context "
       "and appends the question uncompressed",
       "4 sinks + the newest prompt entries, once after the prompt, then append"},
      {"streamingllm:kvcache-factory",
       "streamingllm",
       {{"budget_rounding", "round"},
        {"sinks", "4"},
        {"compress", "prefill"},
        {"caches", "query_head"}},
       "Zefan-Cai/KVCache-Factory pyramidkv/pyramidkv_utils.py StreamingLLMKVCluster (keeps the "
       "first B - window) + run_longbench.py (window_sizes = B - 4); after repeat_kv",
       "4 sinks + the newest prompt entries, once after the prompt, then append, one cache per "
       "query head (the same set in each)"},
      {"tova:kvpress",
       "tova",
       {{"budget_rounding", "kvpress"}, {"compress", "prefill"}, {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/tova_press.py (TOVAPress); kvpress/pipeline.py compresses "
       "the context "
       "and appends the question uncompressed",
       "last prompt token's head-averaged attention, itself kept, once after the prompt, then "
       "append"},
      {"pyramidkv:kvcache-factory",
       "pyramidkv",
       {{"budget_rounding", "round"},
        {"window", "8"},
        {"kernel", "7"},
        {"pooling", "max"},
        {"beta", "20"},
        {"rounding", "reference"},
        {"caches", "query_head"}},
       "Zefan-Cai/KVCache-Factory run_longbench.py + pyramidkv_utils.py (PyramidKVCluster); "
       "update_kv after repeat_kv (llama_model.py)",
       "window 8, max-pool 7, β 20, the reference's floored layer step, one cache per query head"},
      {"pyramidkv:kvpress",
       "pyramidkv",
       {{"budget_rounding", "kvpress"},
        {"window", "64"},
        {"kernel", "5"},
        {"pooling", "avg"},
        {"beta", "20"},
        {"rounding", "kvpress"},
        {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/pyramidkv_press.py (PyramidKVPress on SnapKVPress); "
       "kvpress/pipeline.py compresses the context "
       "and appends the question uncompressed",
       "window 64, average-pool 5, β 20, kvpress's layer budgets (window included)"},
      {"knorm:kvpress",
       "knorm",
       {{"budget_rounding", "kvpress"}, {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/knorm_press.py (KnormPress); kvpress/pipeline.py "
       "compresses the context and appends the question uncompressed",
       "the smallest key norms of the context, the question appended"},
      {"expected_attention:kvpress",
       "expected_attention",
       {{"budget_rounding", "kvpress"}, {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/expected_attention_press.py (ExpectedAttentionPress, its "
       "defaults); kvpress/pipeline.py compresses the context and appends the question "
       "uncompressed",
       "expected attention of the next 512 positions over the context, the question appended"},
      // kvpress's evaluation registry (evaluation/evaluate_registry.py, PRESS_REGISTRY):
      // "adakv_expected_attention" and "adakv_expected_attention_e2", the configurations its
      // leaderboard reports for expected attention.
      {"adakv:kvpress-expected-attention",
       "adakv",
       {{"budget_rounding", "kvpress"},
        {"alpha", "0.2"},
        {"scorer", "expected_attention"},
        {"safeguard", "kvpress"},
        {"window", "0"},
        {"epsilon", "0"},
        {"question", "append"}},
       "NVIDIA/kvpress evaluation/evaluate_registry.py (\"adakv_expected_attention\": "
       "AdaKVPress(ExpectedAttentionPress())); kvpress/presses/adakv_press.py; "
       "kvpress/pipeline.py appends the question uncompressed",
       "AdaKVPress around ExpectedAttentionPress's defaults, the question appended"},
      {"adakv:kvpress-expected-attention-e2",
       "adakv",
       {{"budget_rounding", "kvpress"},
        {"alpha", "0.2"},
        {"scorer", "expected_attention"},
        {"safeguard", "kvpress"},
        {"window", "0"},
        {"epsilon", "0.01"},
        {"question", "append"}},
       "NVIDIA/kvpress evaluation/evaluate_registry.py (\"adakv_expected_attention_e2\": "
       "AdaKVPress(ExpectedAttentionPress(epsilon=1e-2)), the leaderboard's expected-attention "
       "entry); kvpress/presses/adakv_press.py; kvpress/pipeline.py appends the question "
       "uncompressed",
       "AdaKVPress around ExpectedAttentionPress with epsilon 0.01, the question appended"},
      {"fastv:paper",
       "fastv",
       {{"K", "2"}, {"R", "50"}},
       "Chen et al. 2024, FastV, Sec. 4 (K = 2, R = 50%)",
       "drop half the image tokens after layer 2"},
      {"adakv:kvpress",
       "adakv",
       {{"budget_rounding", "kvpress"},
        {"alpha", "0.2"},
        {"scorer", "snapkv"},
        {"safeguard", "kvpress"},
        {"window", "64"},
        {"kernel", "5"},
        {"pooling", "avg"},
        {"question", "append"}},
       "NVIDIA/kvpress kvpress/presses/adakv_press.py (AdaKVPress around SnapKVPress); "
       "kvpress/pipeline.py compresses the context "
       "and appends the question uncompressed",
       "each KV head keeps its int(0.2 B) best (window included), the rest by joint top-k"},
      {"adakv:kvcache-factory",
       "adakv",
       {{"budget_rounding", "round"},
        {"alpha", "0.2"},
        {"scorer", "snapkv"},
        {"safeguard", "authors"},
        {"normalize", "true"},
        {"window", "8"},
        {"kernel", "7"},
        {"pooling", "max"},
        {"caches", "query_head"}},
       "Zefan-Cai/KVCache-Factory pyramidkv/pyramidkv_utils.py AdaKVCluster (adapted from "
       "FFY0/AdaKV; init_adakv: normalize = True; its query heads are the cache heads, after "
       "repeat_kv) + run_longbench.py (window 8, kernel 7, maxpool, --floor 0.2)",
       "per-head budgets from each head's share of the normalised joint top-k, floor 0.2, one "
       "cache per query head"},
      {"adakv:authors",
       "adakv",
       {{"alpha", "0.2"},
        {"scorer", "snapkv"},
        {"safeguard", "authors"},
        {"normalize", "false"},
        {"window", "32"},
        {"kernel", "7"},
        {"pooling", "max"},
        {"caches", "query_head"}},
       "FFY0/AdaKV adaptive_snapkv/monkeypatch/snapkv_utils.py AdaptiveSnapKVCluster "
       "(update_kv_wo_gqa: repeat_kv, a cache per query head) + experiments/LongBench/pred.py "
       "(config c*_w32_k7_maxpool.json; --normalize off unless given) + GQA_eval_longbench.sh "
       "(--floor_alpha 0.2); its --gqa_support is caches=kv_head (group mean before pooling)",
       "per-head budgets from each head's share of the joint top-k (no normalisation), floor 0.2, "
       "window 32, max-pool 7, one cache per query head"},
      {"lookm:released",
       "lookm",
       {{"budget_rounding", "parts"},
        {"recent_ratio", "0.5"},
        {"sinks", "0"},
        {"text", "all"},
        {"merge", "pivotal"}},
       "SUSTechBruce/LOOK-M LLaVA-mix_merge_v1/llava/model/kv_token_merge/modify_llama.py "
       "(TextPivotMerge_LayerWise: heavy and recent int(P * ratio) each, image spans and the "
       "window at -65516, keep-mask score >= 0, every pruned entry pivot-merged into its most "
       "cosine-similar kept key); decoding appends (the paper's look-once)",
       "every text entry, the best images up to half the budget, the recent half, pivot merge"},
      {"hae:table1",
       "hae",
       {{"visual_keep", "192"},
        {"budget", "auto"},
        {"r", "0.0012"},
        {"alpha", "0.001"},
        {"rc_size", "64"}},
       "HAE paper, Sec. 4.2 (Table 1, LLaVA-1.5-7B understanding: \"retaining 192 visual tokens "
       "for a fair comparison\") and Table 5 (HAE-LLaVA: r, alpha, RC_size)",
       "DAP keeps the 192 best image tokens by Eq. 1, then DDES with RC_size 64 around l = |S_1|"},
      {"hae:table2",
       "hae",
       {{"budget", "1024"}, {"r", "0.0005"}, {"alpha", "0.0005"}, {"rc_size", "128"}},
       "HAE paper, Sec. 4.1 (image-based long text generation: \"a preset KV-Cache size of 1024\", "
       "at most 512 generated tokens) and Table 5 (HAE-Phi3.5, Table 2's row)",
       "DAP with r = alpha = 0.0005, then DDES around 1024 entries with RC_size 128"},
      {"hae:table3",
       "hae",
       {{"budget", "956"}, {"r", "0.0015"}, {"alpha", "0.0015"}, {"rc_size", "56"}},
       "HAE paper, Table 3 (Phi3.5 ablation, \"956(56)\" tokens) and Table 5 (HAE-Phi3.5 "
       "All-Stage)",
       "DAP with r = alpha = 0.0015, then DDES around 956 entries with RC_size 56"},
      {"adakv:paper",
       "adakv",
       {{"alpha", "0.2"},
        {"scorer", "snapkv"},
        {"window", "32"},
        {"kernel", "7"},
        {"pooling", "max"}},
       "Feng et al. 2024, Ada-KV, Sec. 4 (SnapKV scorer, floor 0.2), as kvsim reads Algorithm 1; "
       "not the authors' code, which normalises scores per head and rounds each head's share",
       "head-adaptive SnapKV, α = 0.2"},
  };
  return presets;
}

}  // namespace kvsim
