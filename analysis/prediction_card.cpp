#include "analysis/prediction_card.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace kvsim {

double PredictionCard::predict(double x) const {
  if (x <= knots_x.front()) return knots_y.front();
  if (x >= knots_x.back()) return knots_y.back();
  std::size_t i = 1;
  while (knots_x[i] < x) ++i;
  const double t = (x - knots_x[i - 1]) / (knots_x[i] - knots_x[i - 1]);
  return knots_y[i - 1] + t * (knots_y[i] - knots_y[i - 1]);
}

PredictionCard read_prediction_card(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("--card " + path + ": cannot open");
  return parse_prediction_card(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

PredictionCard parse_prediction_card(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("--card " + path + ": not JSON (" + e.what() + ")");
  }
  PredictionCard c;
  c.path = path;
  if (j.is_object() && j.contains("at_chance")) {
    // kvsim.report.prediction_card's card of a model whose full cache answers at chance: no map.
    const auto& r = j.at("at_chance");
    auto number = [&](const char* key) {
      if (!r.is_object() || !r.contains(key) || !r.at(key).is_number()) return std::string("?");
      char text[32];
      std::snprintf(text, sizeof text, "%.3f", r.at(key).get<double>());
      return std::string(text);
    };
    throw std::invalid_argument("--card " + path + ": no prediction to make: the card's model (" +
                                j.value("model", std::string("?")) +
                                ") answers at chance with the full cache (" + number("accuracy") +
                                ", 95% interval " + number("ci_low") + " to " + number("ci_high") +
                                "; chance " + number("chance") +
                                "), so its card maps nothing; use a card of a model that reads "
                                "its inputs");
  }
  try {
    c.model = j.at("model").get<std::string>();
    c.metric = j.at("metric").get<std::string>();
    c.outcome = j.at("outcome").get<std::string>();
    c.knots_x = j.at("map").at("knots_x").get<std::vector<double>>();
    c.knots_y = j.at("map").at("knots_y").get<std::vector<double>>();
    if (j.at("map").contains("residual_95")) {
      const auto r = j.at("map").at("residual_95").get<std::vector<double>>();
      if (r.size() == 2) c.residual_low = r[0], c.residual_high = r[1], c.has_residuals = true;
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("--card " + path + ": not a prediction card (" + e.what() +
                                "; kvsim.report.prediction_card writes one)");
  }
  if (c.metric != "replay_output_rel_error" && c.metric != "replay_mass_recall")
    throw std::invalid_argument("--card " + path + ": metric '" + c.metric +
                                "' is not one replay prints (replay_output_rel_error, "
                                "replay_mass_recall)");
  if (c.knots_x.empty() || c.knots_x.size() != c.knots_y.size())
    throw std::invalid_argument("--card " + path + ": knots_x and knots_y differ or are empty");
  for (std::size_t i = 0; i < c.knots_x.size(); ++i)
    if (!std::isfinite(c.knots_x[i]) || !std::isfinite(c.knots_y[i]))
      throw std::invalid_argument("--card " + path + ": a knot is not a finite number");
  for (std::size_t i = 1; i < c.knots_x.size(); ++i)
    if (!(c.knots_x[i] > c.knots_x[i - 1]))
      throw std::invalid_argument("--card " + path + ": knots_x is not increasing");
  return c;
}

}  // namespace kvsim
