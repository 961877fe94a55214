// `mpirun -n N kvsim live capture|evaluate` splits the samples of a prompt file over the ranks and
// writes the same bytes as one process; a rank that fails stops every rank, and keeps what the
// others finished for a rerun.
#include <gtest/gtest.h>

#include <filesystem>

#include "sim/run/mpi_world.hpp"
#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"
#include "traces/prompt_file.hpp"

namespace kvsim::test {
namespace {

namespace fs = std::filesystem;

TEST(SplitByCost, LargestFirstEachToTheLeastLoadedRank) {
  // Costs 5, 3, 3, 2, 1 over two ranks, largest first: 5 -> rank 0 (loads 5, 0); the first 3 ->
  // rank 1 (5, 3); the second 3 -> rank 1 (5, 6); 2 -> rank 0 (7, 6); 1 -> rank 1 (7, 7).
  EXPECT_EQ(split_by_cost({5, 3, 3, 2, 1}, 2), (std::vector<int>{0, 1, 1, 0, 1}));
  // Equal costs go round the ranks in order (ties: the lower index first, the lower rank first).
  EXPECT_EQ(split_by_cost({1, 1, 1, 1, 1}, 3), (std::vector<int>{0, 1, 2, 0, 1}));
  EXPECT_EQ(split_by_cost({4, 9}, 1), (std::vector<int>{0, 0}));
  EXPECT_TRUE(split_by_cost({}, 4).empty());
  EXPECT_THROW(split_by_cost({1}, 0), std::invalid_argument);
}

TEST(World, OneProcessIsAWorldOfOne) {
  const World world;  // the test binary is not started by mpirun
  EXPECT_EQ(world.size(), 1);
  EXPECT_EQ(world.rank(), 0);
  EXPECT_FALSE(world.distributed());
  EXPECT_NO_THROW(world.settle(nullptr, ""));
  const auto failed = std::make_exception_ptr(std::runtime_error("sample 'x': broken"));
  EXPECT_THROW(world.settle(failed, ""), std::runtime_error);
}

#ifdef KVSIM_TEST_MPIEXEC

// Five prompts of different lengths (so the split by cost is uneven), each with reference ids
// except, when asked, the second.
std::string write_prompts(const std::string& name, bool second_without_reference) {
  const int lengths[] = {40, 72, 56, 96, 48};
  std::vector<PromptSample> samples;
  for (int i = 0; i < 5; ++i) {
    PromptSample s;
    s.info.name = "s" + std::to_string(i);
    s.info.prompt_len = lengths[i];
    for (int p = 0; p < lengths[i]; ++p) {
      const bool image = p >= 4 && p < 20;
      s.info.token_ids.push_back((p * 37 + i * 11) % 256);
      s.info.modality.push_back(image ? 1 : 0);
      s.info.segment.push_back(p < 4 ? 0 : 1);
      s.info.media_id.push_back(image ? 0 : -1);
    }
    if (!(second_without_reference && i == 1)) s.reference_ids = {3, 1, 4, 1, 5, 9};
    samples.push_back(std::move(s));
  }
  const std::string path = temp_path(name);
  write_prompt_file(path, samples, "random");
  return path;
}

class LiveMpi : public ::testing::Test {
 protected:
  std::string model = temp_path("mpi_model");
  void SetUp() override {
    ASSERT_EQ(kvsim("live make-model -o " + model +
                    " --arch qwen2 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --vocab 256")
                  .code,
              0);
  }
  static CliRun mpirun(int ranks, const std::string& args) {
    const std::string cmd = mpirun_command(ranks, args) + " 2>&1";
    std::FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int status = pclose(p);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }
};

TEST_F(LiveMpi, CaptureAndEvaluateWriteTheSameBytesAsOneProcess) {
  const std::string prompts = write_prompts("mpi_prompts.h5", false);
  auto capture = [&](const std::string& out) {
    return "live capture -m " + model + " --prompts " + prompts + " --gen 6 -j 1 --logits -o " +
           out;
  };
  auto evaluate = [&](const std::string& out) {
    return "live evaluate -m " + model + " --prompts " + prompts +
           " --gen 6 -j 1 -p h2o -p tova -p snapkv --set snapkv.window=4 --budget 50% "
           "--no-timing -o " +
           out + ".csv --summary " + out + "_summary.csv";
  };
  const std::string one = temp_path("mpi_one"), three = temp_path("mpi_three");
  CliRun r = kvsim(capture(one + ".h5"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = mpirun(3, capture(three + ".h5"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("3 ranks"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(one + ".h5"), slurp(three + ".h5"));
  EXPECT_FALSE(fs::exists(three + ".h5.parts"));

  r = kvsim(evaluate(one));
  ASSERT_EQ(r.code, 0) << r.output;
  r = mpirun(2, evaluate(three));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* file : {".csv", "_summary.csv", ".policies.csv"})
    EXPECT_EQ(slurp(one + file), slurp(three + file)) << file;
  EXPECT_FALSE(fs::exists(three + ".csv.parts"));
}

TEST_F(LiveMpi, AFailingRankStopsEveryRankAndTheOthersKeepTheirSamples) {
  // Costs (prompt + 6 steps) 46, 78, 62, 102, 54 over two ranks, largest first: s3 -> rank 0
  // (102, 0), s1 -> 1 (102, 78), s2 -> 1 (102, 140), s4 -> 0 (156, 140), s0 -> 1 (156, 186).
  // Rank 1 goes in sample order: it captures s0, fails at s1 (no reference to force) and never
  // reaches s2; rank 0 finishes s3 and s4. Three pieces are kept.
  const std::string prompts = write_prompts("mpi_broken_prompts.h5", true);
  const std::string out = temp_path("mpi_broken.h5");
  fs::remove_all(out + ".parts");
  const CliRun r = mpirun(2, "live capture -m " + model + " --prompts " + prompts +
                                 " --gen 6 -j 1 --force-reference -o " + out);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2: " + prompts + ": sample 's1' has no reference_ids"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2 failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(out + ".parts/; rerun"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  ASSERT_TRUE(fs::exists(out + ".parts"));
  EXPECT_EQ(std::distance(fs::directory_iterator(out + ".parts"), {}), 3);
}

TEST_F(LiveMpi, EvaluateWithoutAnOutputFileIsRefusedUnderMpirun) {
  const std::string prompts = write_prompts("mpi_table_prompts.h5", false);
  const CliRun r = mpirun(
      2, "live evaluate -m " + model + " --prompts " + prompts + " --gen 2 -p h2o --budget 50%");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("needs --out or --summary"), std::string::npos) << r.output;
}

#endif  // KVSIM_TEST_MPIEXEC

}  // namespace
}  // namespace kvsim::test
