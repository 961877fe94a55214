// Runs policies over a trace and collects LayerResults, for tests.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sim/replay/engine.hpp"

namespace kvsim::test {

inline std::vector<LayerResult> run_policy(const std::string& trace, const std::string& policy,
                                           const std::map<std::string, std::string>& params,
                                           int threads = 1) {
  TraceReader reader(trace);
  Replayer replayer(reader, {make_policy_config(policy, params)},
                    ReplayOptions{.threads = threads});
  std::vector<LayerResult> out;
  for (const auto& s : reader.sample_names())
    replayer.replay_sample(s, [&](const LayerResult& r) { out.push_back(r); });
  return out;
}

// Evicted positions of KV head g at `step`, in eviction order.
inline std::vector<int> evicted_at(const LayerResult& r, int step, int g = 0) {
  std::vector<int> out;
  for (const auto& e : r.evicted[g])
    if (e.step == step) out.push_back(e.position);
  return out;
}

}  // namespace kvsim::test
