// A plain per-step reference replay: for one policy at a time, every statistic is recomputed with
// scalar loops (one dot product per query-key pair, no BLAS, nothing shared between policies),
// and every decode step's softmax is recomputed from q·k over the retained entries. It is slow
// and obviously correct: the tests check the engine against it and the benchmark reports the
// engine's speed-up over it.
#pragma once

#include "sim/replay/engine.hpp"

namespace kvsim {

// Replays layers [0, layers) (all when layers < 0) of a sample through one policy.
std::vector<LayerResult> reference_replay(const TraceReader& reader, const std::string& sample,
                                          const PolicyConfig& policy, int layers = -1);

}  // namespace kvsim
