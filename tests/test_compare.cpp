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
  // Its power statement at Holm's first step of a family of 2 (alpha / 2): differences +1 (x3),
  // -1 (x3), 0 (x34) have SD sqrt(6 / 39); (z_{1-0.0125} + z_0.8) SD / sqrt(40).
  EXPECT_NEAR(t.numbers("detectable")[1],
              (2.241403 + 0.841621) * std::sqrt(6.0 / 39) / std::sqrt(40.0), 1e-5);
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

// A live summary of 12 samples at two budgets: random and h2o at 20%, tova at 40%, st3 sizing
// itself, full keeping everything; h2o beats random on 11 of 12 and ties once.
std::string budgets_csv() {
  const std::string path = temp_path("budgets.csv");
  std::ofstream f(path);
  f << "policy,sample,budget,answer_contains\n";
  for (int i = 0; i < 12; ++i) {
    const std::string s = "s" + std::to_string(10 + i) + ",";
    f << "full," << s << ",1\n";
    f << "random@seed0," << s << "20%,0\n";
    f << "random@seed1," << s << "20%," << (i == 0) << "\n";
    f << "h2o," << s << "20%,1\n";
    f << "tova," << s << "40%,1\n";
    f << "st3," << s << ",1\n";
  }
  return path;
}

TEST(Compare, OnlyRowsOfTheReferencesMemoryAndOneFamilyPerClass) {
  const std::string out = temp_path("compare_memory.csv");
  CliRun r = kvsim("compare " + budgets_csv() + " -m answer_contains -r random -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  CsvTable t = read_csv_table(out);
  ASSERT_EQ(t.rows.size(), 1u);  // h2o only: tova, st3 and full held other memory
  EXPECT_EQ(t.strings("policy")[0], "h2o");
  EXPECT_EQ(t.strings("memory")[0], "budget 20%");
  EXPECT_EQ(t.numbers("family_size")[0], 1);
  // random pooled over its two seeds: 0.5 on s10, 0 elsewhere; h2o 1: 12 wins, sign-flip exact
  // with every sign one way: p = 2 / 2^12.
  EXPECT_NEAR(t.numbers("p_value")[0], 2.0 / 4096, 1e-12);
  EXPECT_EQ(t.strings("verdict")[0], "better");
  EXPECT_NE(r.output.find("not compared, another memory than the reference's (--any-memory "
                          "compares them): full (keeps everything), tova (budget 40%), st3 "
                          "(sizes itself)"),
            std::string::npos)
      << r.output;
  // Named, a row of another memory is refused; --any-memory compares it in a family of its own.
  r = kvsim("compare " + budgets_csv() + " -m answer_contains -r random -p h2o,tova");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("tova (budget 40%) did not hold the memory of the reference random "
                          "(budget 20%)"),
            std::string::npos)
      << r.output;
  r = kvsim("compare " + budgets_csv() + " -m answer_contains -r random --any-memory -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  t = read_csv_table(out);
  ASSERT_EQ(t.rows.size(), 4u);
  const auto memory = t.strings("memory");
  const auto family = t.numbers("family_size");
  EXPECT_EQ(memory, (std::vector<std::string>{"keeps everything", "budget 20%", "budget 40%",
                                              "sizes itself"}));
  EXPECT_EQ(family, (std::vector<double>{1, 1, 1, 1}));
  // The full cache is the ceiling every row is compared with, each class its own Holm family.
  r = kvsim("compare " + budgets_csv() + " -m answer_contains -r full -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  t = read_csv_table(out);
  EXPECT_EQ(t.strings("policy"), (std::vector<std::string>{"random", "h2o", "tova", "st3"}));
  EXPECT_EQ(t.numbers("family_size"), (std::vector<double>{2, 2, 1, 1}));
  // A reference that sizes itself held nobody's memory.
  r = kvsim("compare " + budgets_csv() + " -m answer_contains -r st3");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("the reference 'st3' sizes its own cache"), std::string::npos)
      << r.output;
}

TEST(Compare, SaysWhenTooFewSamplesCanShowNothing) {
  // Five samples: the smallest p either test can give is 2 / 2^5 = 0.0625 > 0.05.
  const std::string path = temp_path("five.csv");
  std::ofstream f(path);
  f << "policy,sample,mean_output_rel_error\n";
  for (int i = 0; i < 5; ++i)
    f << "full,s" << i << ",0.1\nh2o,s" << i << "," << 0.2 + 0.01 * i << "\n";
  f.close();
  const std::string out = temp_path("five_out.csv");
  const CliRun r = kvsim("compare " + path + " -m mean_output_rel_error -o " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("with n = 5 the smallest possible p is 0.0625, not below alpha / 1 = "
                          "0.05 (Holm's first step): no difference can be shown here"),
            std::string::npos)
      << r.output;
  const CsvTable t = read_csv_table(out);
  EXPECT_EQ(t.strings("detectable")[0], "");  // no figure the test cannot reach
  EXPECT_NEAR(t.numbers("smallest_p")[0], 0.0625, 1e-12);
  EXPECT_NEAR(t.numbers("p_value")[0], 0.0625, 1e-12);
  // Brackets hold commas: a sweep's label is one policy.
  std::ofstream g(temp_path("grid.csv"));
  g << "label,sample,mean_output_rel_error,budget_entries\n";
  for (int i = 0; i < 5; ++i)
    g << "\"h2o[budget=20%,recent=5%]\",s" << i << ",0.3,8\ntova,s" << i << ",0.2,8\n";
  g.close();
  const CliRun b = kvsim("compare " + temp_path("grid.csv") +
                         " -m mean_output_rel_error -r tova -p 'h2o[budget=20%,recent=5%]'");
  EXPECT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("h2o[budget=20%,recent=5%]"), std::string::npos) << b.output;
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
  // A card of a model at chance (kvsim.report.prediction_card writes no map): named, not "key 'map'
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
