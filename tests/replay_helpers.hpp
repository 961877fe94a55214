// Runs policies over a trace and collects LayerResults, for tests.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sim/replay/engine.hpp"
#include "traces/hdf5_util.hpp"

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

// An int32 matrix of a decisions dump (empty when the dataset is empty), and its shape.
inline std::vector<std::int32_t> read_ints(hid_t f, const std::string& path,
                                           std::vector<hsize_t>& shape) {
  H5Handle d(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
  if (!d.valid()) throw std::runtime_error(path + ": no such dataset");
  shape = h5_dataset_shape(d.get());
  std::vector<std::int32_t> out(shape.empty() ? 0 : shape[0] * shape[1]);
  if (!out.empty()) H5Dread(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
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
