#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "sim/cli/cli.hpp"

namespace kvsim::cli {

namespace {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Debian's python3 has matplotlib, numpy and h5py (install-deps.sh); $KVSIM_PYTHON overrides.
std::string python() {
  if (const char* p = std::getenv("KVSIM_PYTHON")) return p;
  return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

}  // namespace

Runner add_figures(CLI::App& app) {
  app.description(
      "Regenerate every figure there is data for in RESULTS (kvsim stats files, replay CSVs, or "
      "directories holding them) as PNG and PDF: sparsity, cumulative-attention variance, PPCI "
      "across layers and steps, layer similarity, entropy, head modality preference, attention "
      "share vs generated length, recall and hit rate by layer per policy, budget vs error. "
      "Runs the kvsim package's figures module (python3 -m kvsim.report.figures) with Debian's "
      "python3 (matplotlib, numpy, h5py).");
  app.footer("Example:\n  kvsim figures results.csv stats.h5 -o figs/");
  auto results = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  app.add_option("results", *results, "Result files or directories")->required();
  app.add_option("-o,--out", *out, "Output directory")->required();
  return [=] {
    // The kvsim package: the one built beside this binary (the figures' intervals need its C++
    // module), else the source tree's, unless another is on the path already (an installed
    // package: `python -m kvsim` sets KVSIM_PYTHON to its interpreter).
    const char* path = std::getenv("PYTHONPATH");
    const std::string built = KVSIM_BUILD_PYTHON_DIR;
    const std::string here =
        std::filesystem::exists(built + "/kvsim") ? built : KVSIM_SOURCE_DIR "/python";
    setenv("PYTHONPATH", (path && *path ? std::string(path) + ":" + here : here).c_str(), 1);
    std::string cmd = shell_quote(python()) + " -m kvsim.report.figures";
    for (const auto& r : *results) cmd += " " + shell_quote(r);
    cmd += " --out " + shell_quote(*out);
    const int status = std::system(cmd.c_str());
    if (status == -1 || !WIFEXITED(status))
      throw std::runtime_error("figures: could not run " + cmd);
    return WEXITSTATUS(status);
  };
}

}  // namespace kvsim::cli
