// Long live runs lose nothing: `kvsim live capture` and `evaluate` killed with SIGKILL in the
// middle of a multi-sample prompt file resume where they stopped, with the same bytes as an
// uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/cli_helpers.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

namespace fs = std::filesystem;

std::size_t files_in(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return 0;
  return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir, ec), {}));
}

// Starts `args`, kills it with SIGKILL once `parts` holds a finished sample, and returns how
// many samples were finished by then.
std::size_t kill_midway(const std::string& args, const fs::path& parts) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + std::string(KVSIM_BINARY) + " " + args).c_str(),
          nullptr);
    _exit(127);
  }
  for (int i = 0; i < 20000 && files_in(parts) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return files_in(parts);
}

class LiveResume : public ::testing::Test {
 protected:
  static constexpr int kSamples = 6;
  std::string model = temp_path("resume_model"), prompts = temp_path("resume_prompts.h5");
  void SetUp() override {
    ASSERT_EQ(kvsim("live make-model -o " + model +
                    " --arch llama --layers 4 --hidden 128 --heads 4 --kv-heads 2 --vocab 512")
                  .code,
              0);
    ASSERT_EQ(kvsim("live make-prompt -o " + prompts + " --samples " + std::to_string(kSamples) +
                    " --prompt-len 160 --image-tokens 64 --vocab 512")
                  .code,
              0);
  }
  // Runs `command` (with OUT in place of the output) uninterrupted, then killed midway and
  // resumed, and returns both outputs' bytes.
  void expect_same_after_kill(const std::string& command, const std::string& name) {
    auto with_out = [&](const std::string& out) {
      std::string c = command;
      c.replace(c.find("OUT"), 3, out);
      return c;
    };
    const std::string whole = temp_path(name + "_whole"), resumed = temp_path(name + "_resumed");
    const CliRun a = kvsim(with_out(whole));
    ASSERT_EQ(a.code, 0) << a.output;
    EXPECT_FALSE(fs::exists(whole + ".parts"));  // removed once the output is published
    const std::size_t finished =
        kill_midway(with_out(resumed) + " >/dev/null 2>&1", resumed + ".parts");
    EXPECT_FALSE(fs::exists(resumed)) << "the run finished before it could be killed";
    EXPECT_GE(finished, 1u);
    EXPECT_LT(finished, static_cast<std::size_t>(kSamples));
    const CliRun b = kvsim(with_out(resumed));
    ASSERT_EQ(b.code, 0) << b.output;
    EXPECT_EQ(slurp(whole), slurp(resumed)) << name;
    EXPECT_FALSE(fs::exists(resumed + ".parts"));
  }
};

TEST_F(LiveResume, CaptureKilledMidwayResumesWithTheSameBytes) {
  expect_same_after_kill("live capture -m " + model + " --prompts " + prompts +
                             " --gen 24 -j 1 --dtype float16 -o OUT",
                         "capture.h5");
}

TEST_F(LiveResume, EvaluateKilledMidwayResumesWithTheSameBytes) {
  expect_same_after_kill("live evaluate -m " + model + " --prompts " + prompts +
                             " --gen 24 -j 1 --no-timing --policy h2o --policy snapkv "
                             "--budget 40 -o OUT",
                         "evaluate.csv");
}

}  // namespace
}  // namespace kvsim::test
