// Replay's summary: the sample count and bootstrap intervals of every overall row, and the runs of
// a seeded policy (--seeds) reported together, checked against the per-sample rows of the same
// file.
#include <gtest/gtest.h>

#include <map>

#include "analysis/bootstrap.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/synth.hpp"

namespace kvsim::test {
namespace {

using Row = std::map<std::string, std::string>;

std::vector<Row> read_csv(const std::string& text) {
  std::vector<Row> rows;
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> header;
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
    if (line.back() == ',') fields.push_back("");
    if (header.empty()) {
      header = fields;
      continue;
    }
    Row r;
    for (std::size_t i = 0; i < header.size(); ++i)
      r[header[i]] = i < fields.size() ? fields[i] : "";
    rows.push_back(r);
  }
  return rows;
}

const Row& find_row(const std::vector<Row>& rows, const std::string& policy) {
  for (const Row& r : rows)
    if (r.at("policy") == policy && r.at("sample") == "all") return r;
  throw std::runtime_error("no overall row for " + policy);
}

std::string three_sample_trace() {
  SynthConfig c;
  c.samples = 3;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.media_tokens = 48;
  c.user_tokens = 8;
  c.gen_tokens = 6;
  const std::string path = temp_path("intervals.h5");
  synth_write(c, path);
  return path;
}

TEST(SummaryIntervals, OverallRowsCarryNAndABootstrapOverSamples) {
  const std::string trace = three_sample_trace();
  const std::string csv = temp_path("intervals.csv"), csv2 = temp_path("intervals2.csv");
  CliRun r =
      kvsim("replay " + trace + " -p h2o,random --budget 20% --seeds 3 -j 1 --summary " + csv);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("random (3 seeds)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("percentile bootstrap over the n samples"), std::string::npos);
  ASSERT_EQ(
      kvsim("replay " + trace + " -p h2o,random --budget 20% --seeds 3 -j 2 --summary " + csv2)
          .code,
      0);
  EXPECT_EQ(slurp(csv), slurp(csv2));  // the same bytes whatever the threads
  const auto rows = read_csv(slurp(csv));

  // h2o: per sample Σ rows · mean recall and Σ rows over its layer rows; the overall mean is their
  // pooled ratio and its interval resamples the three samples (analysis/bootstrap.hpp, seed 0).
  std::map<std::string, std::pair<double, double>> sums;
  for (const Row& row : rows)
    if (row.at("policy") == "h2o" && row.at("sample") != "all") {
      const double n = std::stod(row.at("rows"));
      sums[row.at("sample")].first += n * std::stod(row.at("mean_mass_recall"));
      sums[row.at("sample")].second += n;
      EXPECT_EQ(row.at("samples"), "1");
      EXPECT_EQ(row.at("mass_recall_ci_low"), "");
    }
  ASSERT_EQ(sums.size(), 3u);
  std::vector<double> num, den;
  for (const auto& [name, s] : sums) num.push_back(s.first), den.push_back(s.second);
  const Interval expected = bootstrap_ratio(num, den);
  const Row& h2o = find_row(rows, "h2o");
  EXPECT_EQ(h2o.at("samples"), "3");
  EXPECT_EQ(h2o.at("seeds"), "1");
  EXPECT_NEAR(std::stod(h2o.at("mean_mass_recall")),
              (num[0] + num[1] + num[2]) / (den[0] + den[1] + den[2]), 1e-7);
  EXPECT_NEAR(std::stod(h2o.at("mass_recall_ci_low")), expected.low, 1e-6);
  EXPECT_NEAR(std::stod(h2o.at("mass_recall_ci_high")), expected.high, 1e-6);
  EXPECT_LT(expected.low, expected.high);

  // random: one row per seed, and the group pooling them: the mean of the three (equal rows) and
  // their SD over seeds.
  std::vector<double> seed_means;
  for (int k = 0; k < 3; ++k)
    seed_means.push_back(
        std::stod(find_row(rows, "random@seed" + std::to_string(k)).at("mean_mass_recall")));
  const Row& group = find_row(rows, "random");
  EXPECT_EQ(group.at("seeds"), "3");
  EXPECT_EQ(group.at("samples"), "3");
  const MeanSd over = mean_sd(seed_means);
  EXPECT_NEAR(std::stod(group.at("mean_mass_recall")), over.mean, 1e-7);
  EXPECT_NEAR(std::stod(group.at("mass_recall_seed_sd")), over.sd, 1e-7);
  EXPECT_NE(seed_means[0], seed_means[1]);  // different draws

  // --seeds 1, or a seed given, runs the policy once under its own name.
  r = kvsim("replay " + trace + " -p random --budget 20% --seeds 1 --summary " + csv);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NO_THROW(find_row(read_csv(slurp(csv)), "random"));
  r = kvsim("replay " + trace + " -p random --budget 20% --set random.seed=4 --summary " + csv);
  EXPECT_EQ(find_row(read_csv(slurp(csv)), "random").at("seeds"), "1");
}

TEST(SummaryIntervals, OneSampleSaysThereIsNoInterval) {
  const std::string trace = small_synthetic_trace("one_sample.h5", 2);
  const CliRun r = kvsim("replay " + trace + " -p h2o --budget 20%");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("n = 1 sample: no intervals"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvsim::test
