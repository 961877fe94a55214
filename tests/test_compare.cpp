// `kvsim compare`: per-sample values from kvsim's result tables, seed groups pooled, and the
// paired comparisons on a constructed table with a difference shown and one not.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "analysis/comparison.hpp"
#include "analysis/csv_table.hpp"
#include "analysis/prediction_card.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

TEST(CsvTable, QuotedFieldsAndErrors) {
  const CsvTable t = parse_csv_table(
      "policy,sample,answer\nh2o,a,\"say \"\"hi\"\", then\nbye\"\nfull,b,\n", "x.csv");
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0][2], "say \"hi\", then\nbye");
  EXPECT_EQ(t.rows[1][2], "");
  EXPECT_EQ(parse_csv_table("m\n\n1\n", "y.csv").numbers("m"), std::vector<double>{1.0});
  EXPECT_THROW(parse_csv_table("a,b\n1\n", "bad.csv"), std::invalid_argument);
  EXPECT_THROW(parse_csv_table("a\n\"open\n", "bad.csv"), std::invalid_argument);
  try {
    parse_csv_table("a,b\n1,x\n", "t.csv").numbers("b");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("t.csv: line 2, column 'b': 'x' is not a number"),
              std::string::npos);
  }
  try {
    parse_csv_table("a,b\n1,2\n", "t.csv").strings("c");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no column 'c' (it has: a, b)"), std::string::npos);
  }
}

TEST(Compare, PerSampleValuesWeighRowsAndPoolSeeds) {
  // h2o on sample a: layers with 2 rows at 0.5 and 1 row at 0.8 -> (1.0 + 0.8) / 3 = 0.6.
  // random@seed0 / @seed1 on a: 0.2 and 0.4 -> random 0.3; on b only seed1: 0.6.
  const SampleTable t = per_sample_values(
      {"h2o", "h2o", "h2o", "random@seed0", "random@seed1", "random@seed1", "h2o"},
      {"a", "a", "b", "a", "a", "b", "all"}, {0.5, 0.8, 0.9, 0.2, 0.4, 0.6, 7.0},
      {2, 1, 1, 1, 1, 1, 99});
  EXPECT_EQ(t.samples, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(t.policies, (std::vector<std::string>{"h2o", "random"}));
  EXPECT_EQ(t.seeds, (std::vector<int>{1, 2}));
  EXPECT_NEAR(t.values[0][0], 0.6, 1e-15);
  EXPECT_NEAR(t.values[0][1], 0.9, 1e-15);
  EXPECT_NEAR(t.values[1][0], 0.3, 1e-15);
  EXPECT_NEAR(t.values[1][1], 0.6, 1e-15);
  // A sweep's seed axis groups the same way.
  const SampleTable s =
      per_sample_values({"random[seed=0]", "random[seed=1]"}, {"a", "a"}, {0.1, 0.3});
  EXPECT_EQ(s.policies, (std::vector<std::string>{"random"}));
  EXPECT_NEAR(s.values[0][0], 0.2, 1e-15);
}

TEST(Compare, MetricDirections) {
  EXPECT_EQ(higher_is_better("answer_contains"), true);
  EXPECT_EQ(higher_is_better("mean_mass_recall"), true);
  EXPECT_EQ(higher_is_better("mean_output_rel_error"), false);
  EXPECT_EQ(higher_is_better("ref_nll"), false);
  EXPECT_EQ(higher_is_better("mean_kl"), false);
  EXPECT_EQ(higher_is_better("first_divergence"), std::nullopt);
}

// 40 samples answered right (1) or wrong (0): the reference right on 20; `good` right on the same
// 20 and 16 more, wrong on 2 of the reference's (b = 16, c = 2); `same` differs on 3 each way.
std::string answers_csv() {
  const std::string path = temp_path("answers.csv");
  std::ofstream f(path);
  f << "policy,sample,answer_contains,answer\n";
  for (int i = 0; i < 40; ++i) {
    const std::string s = "s" + std::to_string(100 + i);
    const int ref = i < 20;
    const int good = (i < 20 && i >= 2) || (i >= 20 && i < 36);
    const int same = (i < 20 && i >= 3) || (i >= 20 && i < 23);
    f << "full," << s << "," << ref << ",\"a, b\"\n";
    f << "good," << s << "," << good << ",x\n";
    f << "same," << s << "," << same << ",x\n";
  }
  return path;
}

TEST(Compare, ShowsOneDifferenceAndNotTheOther) {
  const std::string out = temp_path("compare.csv");
  const CliRun r = kvsim("compare " + answers_csv() + " -m answer_contains -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const CsvTable t = read_csv_table(out);
  ASSERT_EQ(t.rows.size(), 2u);
  const auto verdict = t.strings("verdict"), test = t.strings("test");
  const auto p = t.numbers("p_value"), holm = t.numbers("p_holm"), diff = t.numbers("difference");
  const auto wins = t.numbers("wins"), losses = t.numbers("losses");
  // good: McNemar 16 vs 2: p = 2 Σ_{k<=2} C(18, k) / 2^18 = 2 (1 + 18 + 153) / 262144.
  EXPECT_EQ(test[0], "mcnemar");
  EXPECT_NEAR(p[0], 2 * 172.0 / 262144, 1e-12);
  EXPECT_NEAR(diff[0], 14.0 / 40, 1e-12);
  EXPECT_EQ(wins[0], 16);
  EXPECT_EQ(losses[0], 2);
  EXPECT_EQ(verdict[0], "better");
  EXPECT_NEAR(holm[0], 2 * p[0], 1e-12);  // the smaller of two p-values, times 2
  // same: 3 vs 3: p = 1, no difference shown (and no order).
  EXPECT_NEAR(p[1], 1.0, 1e-12);
  EXPECT_EQ(verdict[1], "no difference shown");
  EXPECT_NE(r.output.find("no difference shown"), std::string::npos);
  // Errors name what is wrong.
  CliRun bad = kvsim("compare " + answers_csv() + " -m answer_contains -r nobody");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("no reference 'nobody' among the policies (full, good, same)"),
            std::string::npos)
      << bad.output;
  bad = kvsim("compare " + answers_csv() + " -m answer");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("is not a number"), std::string::npos) << bad.output;
  bad = kvsim("compare " + answers_csv() + " -m first_divergence");
  EXPECT_NE(bad.output.find("no column 'first_divergence'"), std::string::npos) << bad.output;
}

TEST(PredictionCard, ReadsTheMapAndPredictsBetweenItsKnots) {
  const std::string path = temp_path("card.json");
  std::ofstream(path) << R"({"model": "toy", "metric": "replay_output_rel_error",
    "outcome": "contains", "map": {"knots_x": [0.1, 0.3, 0.5], "knots_y": [0.9, 0.5, 0.4],
    "residual_95": [-0.05, 0.1]}})";
  const PredictionCard c = read_prediction_card(path);
  EXPECT_DOUBLE_EQ(c.predict(0.0), 0.9);  // constant below the first knot
  EXPECT_DOUBLE_EQ(c.predict(0.2), 0.7);  // half way from 0.9 to 0.5
  EXPECT_DOUBLE_EQ(c.predict(0.45), 0.425);
  EXPECT_DOUBLE_EQ(c.predict(2.0), 0.4);
  EXPECT_TRUE(c.has_residuals);
  const std::string bad = temp_path("bad_card.json");
  std::ofstream(bad) << R"({"model": "toy", "metric": "replay_output_rel_error",
    "outcome": "contains", "map": {"knots_x": [0.3, 0.1], "knots_y": [0.9, 0.5]}})";
  EXPECT_THROW(read_prediction_card(bad), std::invalid_argument);
  std::ofstream(bad) << "not json";
  EXPECT_THROW(read_prediction_card(bad), std::invalid_argument);
  // A card of a model at chance (analysis/prediction_card.py writes no map): named, not "key 'map'
  // not found".
  const std::string chance = temp_path("chance_card.json");
  std::ofstream(chance) << R"({"model": "small", "metric": "replay_output_rel_error",
    "outcome": "contains", "at_chance": {"accuracy": 0.05, "ci_low": 0.0, "ci_high": 0.15,
    "n": 20, "chance": 0.1, "above_chance": false}})";
  try {
    read_prediction_card(chance);
    ADD_FAILURE() << "an at-chance card was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "no prediction to make: the card's model (small) "
                  "answers at chance with the full cache (0.050, 95% interval 0.000 "
                  "to 0.150; chance 0.100)"),
              std::string::npos)
        << e.what();
  }
  // kvsim replay --card prints each policy's prediction: h2o's error read back from the table.
  const std::string trace = small_synthetic_trace("card.h5", 2);
  const CliRun r = kvsim("replay " + trace + " -p h2o --budget 20% --card " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("predicted live accuracy of toy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("h2o "), r.output.rfind("h2o "));  // in the table and the predictions
}

}  // namespace
}  // namespace kvsim::test
