// Compact against full traces as the prompt grows: synthetic video traces with Qwen2-VL-7B's
// attention shape (28 query heads, 4 KV heads, d = 128; 2 layers; 256 tokens per frame; 64
// generated tokens), replayed through five policies (full, h2o, snapkv, streamingllm, tova at
// 20%) from the full trace and from its compact copy, beside the GEMM floor of the full replay
// measured on this machine in the same run. The compact traces replayed are written without the
// prompt entropies (--no-entropies: only MEDA reads them, and they cost a pass over all P² logits
// of every head, unmasked); the compaction is also timed with them (kvsim compact's default),
// each beside the GEMM floor of its own products.
//
//   kvsim_bench_compact [--prompts 2048,8192,32768] [--dir DIR] [google-benchmark flags]
//   kvsim_bench_compact --floors FULL_TRACE [--compact COMPACT_TRACE]
//                                    the GEMM floors of FULL_TRACE's stages, as CSV; the compact
//                                    replay's of COMPACT_TRACE (whether it stores the decode
//                                    results), else of a compact trace this kvsim writes
//
// Traces are written to DIR (default: a fresh temporary directory, removed at the end) and kept
// there between runs when DIR is given. Prints, per prompt length, both replay times, the
// speed-up, the full replay over its GEMM floor, the one-time compaction and the file sizes.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "experiments/bench_common.hpp"
#include "sim/replay/engine.hpp"
#include "sim/run/compact_trace.hpp"
#include "traces/synth.hpp"

namespace {

namespace fs = std::filesystem;
using kvsim::bench::attention_gflop;
using kvsim::bench::causal_prompt_logits;
using kvsim::bench::hardware_threads;
using kvsim::bench::measure_gemm_rate;

constexpr int kFrameTokens = 256;

std::vector<int> prompts = {2048, 8192, 32768};
fs::path dir;

struct Measured {
  double full_s = 0, compact_s = 0, compaction_s = 0, floor_gflop = 0;
  double entropies_s = 0, compaction_gflop = 0, entropies_gflop = 0;  // compaction with entropies
  std::uintmax_t full_bytes = 0, compact_bytes = 0;
  int prompt_len = 0;
};
std::map<int, Measured> measured;   // by requested prompt length
std::map<int, double> gemm_gflops;  // by key count of the product

std::vector<kvsim::PolicyConfig> policies() {
  std::vector<kvsim::PolicyConfig> p{kvsim::make_policy_config("full", {})};
  for (const char* name : {"h2o", "snapkv", "streamingllm", "tova"})
    p.push_back(kvsim::make_policy_config(name, {{"budget", "20%"}}));
  return p;
}

// Frames of 256 tokens filling about `prompt` tokens after a 35-token system prompt and before a
// 29-token question.
kvsim::SynthConfig video_config(int prompt) {
  kvsim::SynthConfig c;
  c.model = "synthetic-qwen2-vl-7b-video";
  c.layers = 2;
  c.heads = 28;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.video = true;
  c.media_tokens = kFrameTokens;
  c.separator_tokens = 0;
  c.media_count =
      std::max(1, (prompt - c.system_tokens - c.user_tokens + kFrameTokens / 2) / kFrameTokens);
  c.gen_tokens = 64;
  return c;
}

fs::path full_path(int prompt) {
  return dir / ("video_" + std::to_string(prompt) + ".h5");
}
fs::path compact_path(int prompt) {
  return dir / ("video_" + std::to_string(prompt) + ".compact.h5");
}

// The products a compaction computes, in GFLOP: the causal prompt logits in blocks of 64 rows,
// with the context's last block again at the context's shape when the context (the prompt before
// its question) ends inside a block, the decode steps' logits and full-cache outputs it stores,
// and (with the entropies) every prompt row against every prompt key; for every query head and
// layer.
std::pair<double, double> compaction_gflop(const kvsim::TraceReader& reader) {
  const auto& info = reader.info();
  double prompt = 0, entropies = 0;
  for (const auto& name : reader.sample_names()) {
    const auto s = reader.read_sample(name);
    const int question = kvsim::question_length(s);
    const double per_head = 2.0 * info.head_dim * info.num_heads * info.num_layers / 1e9;
    const double context = question > 0 ? s.prompt_len - question : 0;
    const double decode = s.has_v ? 2.0 * s.gen_len * s.total_len() : 0.0;
    prompt += (causal_prompt_logits(s.prompt_len) + std::fmod(context, 64.0) * context + decode) *
              per_head;
    entropies += static_cast<double>(s.prompt_len) * s.prompt_len * per_head;
  }
  return {prompt, entropies};
}

// The products a replay of the compact copy computes, in GFLOP: the full replay's less the
// prompt rows before the first it keeps (a 64-row window's block) and, when the compact trace
// stores them (`stores_decode`), the full-cache outputs of the decode steps.
double compact_replay_gflop(const kvsim::TraceReader& reader, bool stores_decode) {
  const auto& info = reader.info();
  double skipped = 0;
  for (const auto& name : reader.sample_names()) {
    const auto s = reader.read_sample(name);
    skipped += causal_prompt_logits(kvsim::compact_first_row(s, 64));
    if (s.has_v && stores_decode) skipped += static_cast<double>(s.gen_len) * s.total_len();
  }
  return attention_gflop(reader) -
         skipped * 2.0 * info.head_dim * info.num_heads * info.num_layers / 1e9;
}

// Whether a compact trace stores the full cache's decode results (its first sample's first layer
// does; compact traces written before they were stored do not).
bool stores_decode_results(const fs::path& compact) {
  const kvsim::TraceReader reader(compact);
  if (!reader.info().compact())
    throw std::runtime_error(compact.string() + " is not a compact trace");
  kvsim::LayerTensors t;
  reader.read_layer_into(reader.read_sample(reader.sample_names().front()), 0, t);
  return t.stored && !t.stored->decode.empty();
}

double seconds_to_compact(int prompt, bool entropies, const fs::path& out) {
  const auto start = std::chrono::steady_clock::now();
  kvsim::write_compact_trace(kvsim::TraceReader(full_path(prompt)), out,
                             {.window = 64, .entropies = entropies, .threads = hardware_threads()});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void make_traces(int prompt) {
  if (!fs::exists(full_path(prompt))) kvsim::synth_write(video_config(prompt), full_path(prompt));
  Measured& m = measured[prompt];
  m.compaction_s = seconds_to_compact(prompt, false, compact_path(prompt));
  const fs::path with_entropies = dir / ("video_" + std::to_string(prompt) + ".entropies.h5");
  m.entropies_s = seconds_to_compact(prompt, true, with_entropies);
  fs::remove(with_entropies);
  std::tie(m.compaction_gflop, m.entropies_gflop) =
      compaction_gflop(kvsim::TraceReader(full_path(prompt)));
  m.full_bytes = fs::file_size(full_path(prompt));
  m.compact_bytes = fs::file_size(compact_path(prompt));
}

void replay(const fs::path& trace) {
  const kvsim::TraceReader reader(trace);
  kvsim::Replayer replayer(reader, policies(), {.threads = hardware_threads()});
  for (const auto& s : reader.sample_names()) replayer.replay_sample(s, [](const auto&) {});
}

// Argument: the requested prompt length.
void BM_ReplayFull(benchmark::State& state) {
  for (auto _ : state) replay(full_path(static_cast<int>(state.range(0))));
}
void BM_ReplayCompact(benchmark::State& state) {
  for (auto _ : state) replay(compact_path(static_cast<int>(state.range(0))));
}

// The GEMM rate against each prompt's key count (argument), for the floor printed at the end.
void BM_GemmRate(benchmark::State& state) {
  measure_gemm_rate(state, static_cast<int>(state.range(0)));
}

// BM_GemmRate with `keys` keys: the median of five runs of at least `seconds` each (a single
// one-second run moved by ±15% between runs, and every floor with it).
void register_gemm_rate(int keys, double seconds) {
  benchmark::RegisterBenchmark("BM_GemmRate", BM_GemmRate)
      ->Arg(keys)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(seconds)
      ->Repetitions(5);
}

class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") continue;
      const double s = r.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(r.time_unit);
      const std::string name = r.benchmark_name();
      const int arg = std::atoi(name.substr(name.find('/') + 1).c_str());
      if (name.rfind("BM_ReplayFull", 0) == 0) measured[arg].full_s = s;
      if (name.rfind("BM_ReplayCompact", 0) == 0) measured[arg].compact_s = s;
      if (name.rfind("BM_GemmRate", 0) == 0) gemm_gflops[arg] = r.counters.at("GFLOPs");
    }
  }
};

// --floors: each stage's products over the GEMM rate measured here with the trace's key count;
// the compact replay's as of `compact` when given, else of a compact trace this kvsim writes.
int print_floors(const fs::path& trace, const fs::path& compact) {
  const kvsim::TraceReader reader(trace);
  const int keys = reader.read_sample(reader.sample_names().front()).prompt_len;
  register_gemm_rate(keys, 1.0);
  Collector reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const double rate = gemm_gflops.at(keys);
  const auto [compaction, entropies] = compaction_gflop(reader);
  std::printf("stage,gflop,gemm_gflops_per_s,floor_seconds\n");
  const auto row = [rate](const char* stage, double gflop) {
    std::printf("%s,%.4f,%.1f,%.4f\n", stage, gflop, rate, gflop / rate);
  };
  row("full_replay", attention_gflop(reader));
  row("compaction", compaction);
  row("compaction_with_entropies", compaction + entropies);
  row("compact_replay",
      compact_replay_gflop(reader, compact.empty() || stores_decode_results(compact)));
  return 0;
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  std::vector<char*> rest = {argv[0]};
  bool keep = false;
  fs::path floors_of, compact_of;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--floors") && i + 1 < argc) {
      floors_of = argv[++i];
    } else if (!std::strcmp(argv[i], "--compact") && i + 1 < argc) {
      compact_of = argv[++i];
    } else if (!std::strcmp(argv[i], "--prompts") && i + 1 < argc) {
      prompts = parse_list(argv[++i]);
    } else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) {
      dir = argv[++i];
      keep = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (!floors_of.empty()) {
    int rest_argc = static_cast<int>(rest.size());
    benchmark::Initialize(&rest_argc, rest.data());
    try {
      return print_floors(floors_of, compact_of);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvsim_bench_compact: --floors %s: %s\n", floors_of.c_str(), e.what());
      return 1;
    }
  }
  for (int p : prompts)
    if (p < 512) {
      std::fprintf(stderr, "kvsim_bench_compact: --prompts %d: at least 512 tokens each\n", p);
      return 1;
    }
  if (dir.empty())
    dir = fs::temp_directory_path() / ("kvsim_bench_compact." + std::to_string(getpid()));
  fs::create_directories(dir);
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  for (int p : prompts) {
    std::fprintf(stderr, "writing the %d-token traces in %s ...\n", p, dir.c_str());
    make_traces(p);
    measured[p].prompt_len = kvsim::TraceReader(full_path(p)).read_sample("000000").prompt_len;
    measured[p].floor_gflop = attention_gflop(kvsim::TraceReader(full_path(p)));
    register_gemm_rate(measured[p].prompt_len, 1.0);
    benchmark::RegisterBenchmark("BM_ReplayFull", BM_ReplayFull)
        ->Arg(p)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(p >= 16384 ? 1 : 3);
    benchmark::RegisterBenchmark("BM_ReplayCompact", BM_ReplayCompact)
        ->Arg(p)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
  }
  Collector reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%8s %10s %10s %9s %10s %11s %11s %10s %10s %8s\n", "P", "full s", "compact s",
              "speed-up", "floor s", "full/floor", "compact. s", "full MiB", "comp. MiB", "size");
  for (int p : prompts) {
    const Measured& m = measured[p];
    const double rate = gemm_gflops.count(m.prompt_len) ? gemm_gflops[m.prompt_len] : 0;
    const double floor = rate > 0 ? m.floor_gflop / rate : 0;
    std::printf("%8d %10.3f %10.3f %8.1fx %10.3f %10.2fx %11.2f %10.1f %10.1f %8.3f\n",
                m.prompt_len, m.full_s, m.compact_s, m.compact_s > 0 ? m.full_s / m.compact_s : 0,
                floor, floor > 0 ? m.full_s / floor : 0, m.compaction_s, m.full_bytes / 1048576.0,
                m.compact_bytes / 1048576.0,
                m.full_bytes ? static_cast<double>(m.compact_bytes) / m.full_bytes : 0);
  }
  std::printf("(floor: %s GEMM rate on %d threads, measured above with each prompt's key count)\n",
              "single-precision", hardware_threads());
  std::printf("\n%8s %12s %10s %11s %14s %10s %11s\n", "P", "compaction s", "floor s",
              "comp./floor", "+entropies s", "floor s", "+ent./floor");
  for (int p : prompts) {
    const Measured& m = measured[p];
    const double rate = gemm_gflops.count(m.prompt_len) ? gemm_gflops[m.prompt_len] : 0;
    const double floor = rate > 0 ? m.compaction_gflop / rate : 0;
    const double with = rate > 0 ? (m.compaction_gflop + m.entropies_gflop) / rate : 0;
    std::printf("%8d %12.2f %10.2f %10.2fx %14.2f %10.2f %10.2fx\n", m.prompt_len, m.compaction_s,
                floor, floor > 0 ? m.compaction_s / floor : 0, m.entropies_s, with,
                with > 0 ? m.entropies_s / with : 0);
  }
  std::printf(
      "(compaction: kvsim compact's products, the prompt's causal logits, the context's last "
      "block and, with the entropies, every prompt row against every key)\n");
  benchmark::Shutdown();
  if (!keep) fs::remove_all(dir);
  return 0;
}
