// --stop-at-eos: greedy answers end at the model's end-of-sequence token, read from
// generation_config.json (else config.json). The stop token of these tests is one the random
// model really generates, so the expected lengths follow from an unstopped run.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/live/checkpoint.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void write_json(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump(2);
}

TEST(LiveEos, EosIdsComeFromGenerationConfigThenConfig) {
  const std::string dir = temp_path("eos_model");
  ASSERT_EQ(kvsim("live make-model -o " + dir).code, 0);
  json config = json::parse(slurp(dir + "/config.json"));
  config.erase("eos_token_id");
  write_json(dir + "/config.json", config);
  EXPECT_TRUE(live::read_eos_token_ids(dir).empty());
  config["eos_token_id"] = 7;
  write_json(dir + "/config.json", config);
  EXPECT_EQ(live::read_eos_token_ids(dir), (std::vector<std::int32_t>{7}));
  write_json(dir + "/generation_config.json", json{{"eos_token_id", {3, 9}}});
  EXPECT_EQ(live::read_eos_token_ids(dir), (std::vector<std::int32_t>{3, 9}));
  write_json(dir + "/generation_config.json", json{{"eos_token_id", "two"}});
  EXPECT_THROW(live::read_eos_token_ids(dir), std::exception);
}

TEST(LiveEos, CaptureAndEvaluateStopAtTheFirstEndOfSequenceToken) {
  const std::string dir = temp_path("eos_run"), model = dir + "/model";
  fs::create_directories(dir);
  ASSERT_EQ(kvsim("live make-model -o " + model).code, 0);
  ASSERT_EQ(
      kvsim("live make-prompt -o " + dir + "/p.h5 --samples 1 --prompt-len 24 --image-tokens 8")
          .code,
      0);
  CliRun r = kvsim("live capture -m " + model + " --prompts " + dir + "/p.h5 --gen 12 -o " + dir +
                   "/full.h5");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::int32_t> generated;
  {
    const TraceReader full(dir + "/full.h5");
    const SampleInfo s = full.read_sample(full.sample_names()[0]);
    generated.assign(s.token_ids.begin() + s.prompt_len, s.token_ids.end());
  }
  // The stop token: the first one fed at step k >= 2 that was not fed before.
  int k = 2;
  while (k < 12 &&
         std::find(generated.begin(), generated.begin() + k, generated[k]) != generated.begin() + k)
    ++k;
  ASSERT_LT(k, 12) << "the random model repeats one token; pick another seed";
  const std::int32_t eos = generated[k];
  json config = json::parse(slurp(model + "/config.json"));
  config["eos_token_id"] = eos;
  write_json(model + "/config.json", config);

  r = kvsim("live capture -m " + model + " --prompts " + dir + "/p.h5 --gen 12 --stop-at-eos -o " +
            dir + "/stopped.h5");
  ASSERT_EQ(r.code, 0) << r.output;
  const TraceReader stopped(dir + "/stopped.h5");
  const SampleInfo s = stopped.read_sample(stopped.sample_names()[0]);
  EXPECT_EQ(s.gen_len, k + 1) << "up to and including the end-of-sequence token";
  EXPECT_EQ(s.token_ids.back(), eos);
  EXPECT_TRUE(std::equal(s.token_ids.begin() + s.prompt_len, s.token_ids.end(), generated.begin()));
  const LayerTensors t = stopped.read_layer(s, 0);
  EXPECT_EQ(static_cast<int>(t.q.shape(0)), s.prompt_len + k + 1);

  // evaluate: the full cache's answer predicted[0..G] (predicted[t] is fed at step t) ends at the
  // stop token, predicted[k], which step k - 1 produced: k steps are evaluated, and the answer
  // has k + 1 tokens, as the capture has k + 1 generated positions.
  r = kvsim("live evaluate -m " + model + " --prompts " + dir + "/p.h5 --gen 12 --stop-at-eos " +
            "-p h2o --budget 50% --no-timing --summary " + dir + "/summary.csv");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string summary = slurp(dir + "/summary.csv");
  const std::string row = summary.substr(summary.find('\n') + 1);
  // policy,sample,budget,prompt_len,gen_len,...
  EXPECT_EQ(row.rfind("h2o,000000,50%,24," + std::to_string(k) + ",", 0), 0u) << summary;

  config.erase("eos_token_id");
  write_json(model + "/config.json", config);
  r = kvsim("live capture -m " + model + " --prompts " + dir + "/p.h5 --stop-at-eos -o " + dir +
            "/none.h5");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--stop-at-eos: neither generation_config.json nor config.json"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace kvsim::test
