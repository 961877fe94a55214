// A prediction card (kvsim.report.prediction_card): a monotone map, fitted on live runs of a real
// model, from a replay metric to the live outcome, with the range its out-of-sample residuals
// took. `kvsim replay --card` reads it to print a predicted outcome for every replayed policy.
#pragma once

#include <string>
#include <vector>

namespace kvsim {

struct PredictionCard {
  std::string path, model, metric, outcome;  // metric: replay_output_rel_error | replay_mass_recall
  std::vector<double> knots_x, knots_y;      // increasing x
  double residual_low = 0,
         residual_high = 0;  // 95% of the family-left-out residuals (pred − meas.)
  bool has_residuals = false;
  // The outcome the map gives for a metric value: linear between knots, constant beyond them.
  double predict(double x) const;
};

// Throws std::invalid_argument naming the file and what is wrong (unreadable JSON, a missing
// key, knots out of order, an unknown metric).
PredictionCard read_prediction_card(const std::string& path);
// The same from the file's text (`path` names it in errors).
PredictionCard parse_prediction_card(const std::string& text, const std::string& path);

}  // namespace kvsim
