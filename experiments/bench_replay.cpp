// Replay benchmark (issues #2, #15): the five baselines on the demo trace in one run, against the
// shared work alone (the trace read and the attention products, no policy) and against the plain
// per-step reference (sim/replay/reference_replay.hpp) on the same trace.
//
//   kvsim_bench [--trace demo/demo.h5] [--reference-layers 2] [google-benchmark flags]
//   (e.g. --benchmark_filter='Engine|Shared|Gemm' to skip the slow reference; on a noisy machine
//   add --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true: medians are used)
//
// Reports decode-step x layer x KV-head updates per second (summed over policies), peak resident
// memory, and the engine's speed-up over the reference, whose time is measured on the first
// --reference-layers layers and scaled to the whole trace (all layers have the same shape).
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "experiments/bench_common.hpp"
#include "sim/replay/reference_replay.hpp"
#include "traces/synth.hpp"

namespace {

using kvsim::bench::attention_gflop;
using kvsim::bench::hardware_threads;
using kvsim::bench::measure_gemm_rate;
using kvsim::bench::peak_rss_mib;

std::string trace_path = "demo/demo.h5";
int reference_layers = 2;
double engine_seconds = 0, engine_one_thread_seconds = 0, shared_seconds = 0,
       reference_seconds_per_layer = 0;
int trace_layers = 0;

std::vector<kvsim::PolicyConfig> baselines() {
  std::vector<kvsim::PolicyConfig> p;
  p.push_back(kvsim::make_policy_config("full", {}));
  for (const char* name : {"streamingllm", "h2o", "snapkv", "oracle"})
    p.push_back(kvsim::make_policy_config(name, {{"budget", "20%"}}));
  return p;
}

// Argument: worker threads (1 and every core are registered, for the scaling).
void BM_EngineFiveBaselines(benchmark::State& state) {
  kvsim::TraceReader reader(trace_path);
  const auto policies = baselines();
  const int threads = static_cast<int>(state.range(0));
  long updates = 0;
  for (auto _ : state) {
    kvsim::Replayer replayer(reader, policies, {.threads = threads});
    for (const auto& s : reader.sample_names())
      replayer.replay_sample(s, [&](const kvsim::LayerResult& r) {
        for (const auto& head : r.steps) updates += head.size();
      });
  }
  state.counters["updates_per_s"] =
      benchmark::Counter(static_cast<double>(updates), benchmark::Counter::kIsRate);
  state.counters["peak_rss_MiB"] = peak_rss_mib();
  state.counters["threads"] = threads;
  trace_layers = reader.info().num_layers;
}

// The work every run of the five baselines must do whatever its policies: read every layer and
// compute the shared attention they need (prefill column sums and window rows, decode
// probabilities, full outputs): the same engine, the same pipeline, no policy attached.
void BM_SharedWork(benchmark::State& state) {
  kvsim::TraceReader reader(trace_path);
  kvsim::AttentionNeeds needs;
  for (const auto& p : baselines()) needs.merge(p.needs());
  const int threads = hardware_threads();
  for (auto _ : state) {
    kvsim::Replayer replayer(reader, {}, {.threads = threads});
    replayer.require(needs);
    for (const auto& s : reader.sample_names()) replayer.replay_sample(s, [](const auto&) {});
  }
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

// The GEMM rate on a block of prompt rows against 2,048 keys: the rate the attention products
// could reach, for the floor printed below.
double gemm_gflops = 0;
void BM_GemmRate(benchmark::State& state) {
  measure_gemm_rate(state, 2048);
}

void BM_PlainReference(benchmark::State& state) {
  kvsim::TraceReader reader(trace_path);
  const auto policies = baselines();
  const int layers = std::min(reference_layers, reader.info().num_layers);
  for (auto _ : state)
    for (const auto& s : reader.sample_names())
      for (const auto& p : policies)
        benchmark::DoNotOptimize(kvsim::reference_replay(reader, s, p, layers));
  state.counters["layers_measured"] = layers;
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

// Collects per-iteration times to print the speed-up after both benchmarks ran.
class SpeedupReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    // With --benchmark_repetitions the median (reported after the repetitions) is what counts.
    for (const auto& r : runs) {
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") continue;
      const double s = r.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(r.time_unit);
      if (r.benchmark_name().find("Engine") != std::string::npos) {
        if (r.counters.at("threads") == 1) engine_one_thread_seconds = s;
        if (r.counters.at("threads") == hardware_threads()) engine_seconds = s;
      }
      if (r.benchmark_name().find("SharedWork") != std::string::npos) shared_seconds = s;
      if (r.benchmark_name().find("GemmRate") != std::string::npos)
        gemm_gflops = r.counters.at("GFLOPs");
      if (r.benchmark_name().find("Reference") != std::string::npos)
        reference_seconds_per_layer = s / std::max(1, reference_layers);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--trace") && i + 1 < argc)
      trace_path = argv[++i];
    else if (!std::strcmp(argv[i], "--reference-layers") && i + 1 < argc)
      reference_layers = std::atoi(argv[++i]);
    else
      rest.push_back(argv[i]);
  }
  if (!std::filesystem::exists(trace_path)) {
    std::fprintf(
        stderr,
        "kvsim_bench: %s not found; make it with `kvsim synth --out %s` (experiments/llava_demo.sh "
        "makes it)\n",
        trace_path.c_str(), trace_path.c_str());
    return 1;
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RegisterBenchmark("BM_EngineFiveBaselines", BM_EngineFiveBaselines)
      ->Arg(1)
      ->Arg(hardware_threads())
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(3.0);
  benchmark::RegisterBenchmark("BM_SharedWork", BM_SharedWork)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(3.0);
  benchmark::RegisterBenchmark("BM_GemmRate", BM_GemmRate)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(1.0);
  benchmark::RegisterBenchmark("BM_PlainReference", BM_PlainReference)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->Iterations(1);
  SpeedupReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  if (engine_seconds > 0 && shared_seconds > 0)
    std::printf(
        "\nshared work alone (read + attention): %.3f s\n"
        "engine, five baselines:               %.3f s (%.2fx the shared work)\n",
        shared_seconds, engine_seconds, engine_seconds / shared_seconds);
  if (engine_seconds > 0 && engine_one_thread_seconds > 0 && hardware_threads() > 1)
    std::printf("engine, 1 thread:                     %.3f s (%.2fx speed-up on %d threads)\n",
                engine_one_thread_seconds, engine_one_thread_seconds / engine_seconds,
                hardware_threads());
  if (gemm_gflops > 0) {
    const double gflop = attention_gflop(kvsim::TraceReader(trace_path));
    std::printf("GEMM floor:                           %.3f s (%.1f GFLOP at %.1f GFLOP/s)\n",
                gflop / gemm_gflops, gflop, gemm_gflops);
  }
  if (engine_seconds > 0 && reference_seconds_per_layer > 0) {
    const double reference_total = reference_seconds_per_layer * trace_layers;
    std::printf(
        "\nengine, five baselines, whole trace: %.3f s\n"
        "plain reference, five baselines:    %.1f s (%.2f s/layer x %d layers)\n"
        "speed-up:                           %.1fx\n",
        engine_seconds, reference_total, reference_seconds_per_layer, trace_layers,
        reference_total / engine_seconds);
  }
  benchmark::Shutdown();
  return 0;
}
