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

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "core/sample_stats.hpp"
#include "experiments/bench_common.hpp"
#include "sim/replay/engine.hpp"
#include "sim/run/compact_trace.hpp"
#include "traces/synth.hpp"

namespace {

namespace fs = std::filesystem;
using kvsim::bench::for_each_prompt_block;
using kvsim::bench::hardware_threads;
using kvsim::bench::measure_gemm_rate;

constexpr int kFrameTokens = 256;

// GFLOP of products by their key count: the floors weigh each at the GEMM rate measured with (or
// interpolated to) its keys, since the rate falls as a product's keys outgrow the caches (on a
// 2-core Xeon a full replay ran 6-16% under a floor that took every causal block at the rate of
// the whole prompt's keys, its blocks having P / 2 keys on average).
using Products = std::map<int, double>;

double total_gflop(const Products& products) {
  double sum = 0;
  for (const auto& [keys, gflop] : products) sum += gflop;
  return sum;
}

std::vector<int> prompts = {2048, 8192, 32768};
fs::path dir;

struct Measured {
  double full_s = 0, compact_s = 0, compaction_s = 0, entropies_s = 0;  // entropies: with them
  Products full, compaction, entropies;  // the products of the full replay and the compactions
  std::uintmax_t full_bytes = 0, compact_bytes = 0;
  int prompt_len = 0;
};
std::map<int, Measured> measured;   // by requested prompt length
std::map<int, double> gemm_gflops;  // by key count of the product, 64 rows
std::map<int, double> tall_gflops;  // by key count, a KV group's entropy block of rows
std::set<int> registered_rates;     // key counts whose rate is measured

// The GEMM rate at `keys` keys: measured, or interpolated linearly in log(keys) between the
// nearest key counts measured (the nearest one's beyond them); 0 when none was measured.
double rate_at(int keys, const std::map<int, double>& rates = gemm_gflops) {
  if (rates.empty()) return 0;
  const auto above = rates.lower_bound(keys);
  if (above == rates.end()) return std::prev(above)->second;
  if (above->first == keys || above == rates.begin()) return above->second;
  const auto below = std::prev(above);
  const double t = std::log(static_cast<double>(keys) / below->first) /
                   std::log(static_cast<double>(above->first) / below->first);
  return below->second + t * (above->second - below->second);
}

// Seconds of `products` at the rates measured (of 64-row products, or `rates`); 0 when none was.
double floor_seconds(const Products& products, const std::map<int, double>& rates = gemm_gflops) {
  double s = 0;
  for (const auto& [keys, gflop] : products) {
    const double rate = rate_at(keys, rates);
    if (rate <= 0) return 0;
    s += gflop / rate;
  }
  return s;
}

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

// What a stage of the benchmark computes.
enum class Stage { kFullReplay, kCompaction, kEntropies, kCompactReplay };

// The products of `stage` on every sample of `reader`, per query head and layer: the causal
// prompt logits in blocks of 64 rows (all of them, or from the compact trace's first kept row);
// the compaction's context block again at the context's shape when the context (the prompt
// before its question) ends inside a block; the decode steps' logits and full-cache outputs over
// the T keys (the compact replay's outputs only when the compact trace does not store them,
// `stores_decode`); the entropies' every prompt row against every prompt key. The compaction's
// window statistics take the blocks of the prompt's and the context's last 64 rows again; the
// compact replay computes window blocks only when the trace does not store the window
// statistics its policies read (`stores_window`).
Products products_of(const kvsim::TraceReader& reader, Stage stage, bool stores_decode = true,
                     bool stores_window = true) {
  const auto& info = reader.info();
  const double flop = 2.0 * info.head_dim * info.num_heads * info.num_layers;  // per logit
  Products out;
  for (const auto& name : reader.sample_names()) {
    const auto s = reader.read_sample(name);
    const int P = s.prompt_len, T = s.total_len();
    if (stage == Stage::kEntropies) {
      out[P] += static_cast<double>(P) * P * flop / 1e9;
      continue;
    }
    const auto add = [&](int rows, int keys) {
      out[keys] += static_cast<double>(rows) * keys * flop / 1e9;
    };
    if (stage != Stage::kCompactReplay || !stores_window)
      for_each_prompt_block(P, stage == Stage::kCompactReplay ? kvsim::compact_first_row(s, 64) : 0,
                            add);
    const int question = kvsim::question_length(s), context = question > 0 ? P - question : 0;
    if (stage == Stage::kCompaction && context % 64 != 0) add(context % 64, context);
    if (stage == Stage::kCompaction)  // the window statistics, of the prompt and the context
      for (int len : {P, context})
        if (len > 0) for_each_prompt_block(len, std::max(0, len - 64) / 64 * 64, add);
    const bool outputs = s.has_v && (stage != Stage::kCompactReplay || !stores_decode);
    out[T] += (outputs ? 2.0 : 1.0) * s.gen_len * T * flop / 1e9;  // logits (and outputs)
  }
  return out;
}

// Whether a compact trace stores every window statistic the benchmark's policies read (SnapKV's
// votes, TOVA's last row), so that its replay computes no window rows: compact traces written
// before them do not.
bool stores_window_statistics(const fs::path& compact) {
  const std::vector<int> widths = kvsim::TraceReader(compact).info().compact_window_widths;
  kvsim::AttentionNeeds needs;
  for (const auto& p : policies()) needs.merge(p.needs());
  return needs.prefill_window == 0 && (!needs.last_row_head_mean || !widths.empty()) &&
         std::includes(widths.begin(), widths.end(), needs.window_group_sums.begin(),
                       needs.window_group_sums.end());
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
                             {.window = 64,
                              .entropies = entropies,
                              .window_widths = kvsim::default_window_widths(64),
                              .threads = hardware_threads()});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void make_traces(int prompt) {
  if (!fs::exists(full_path(prompt))) kvsim::synth_write(video_config(prompt), full_path(prompt));
  Measured& m = measured[prompt];
  m.compaction_s = seconds_to_compact(prompt, false, compact_path(prompt));
  const fs::path with_entropies = dir / ("video_" + std::to_string(prompt) + ".entropies.h5");
  m.entropies_s = seconds_to_compact(prompt, true, with_entropies);
  fs::remove(with_entropies);
  const kvsim::TraceReader reader(full_path(prompt));
  m.full = products_of(reader, Stage::kFullReplay);
  m.compaction = products_of(reader, Stage::kCompaction);
  m.entropies = products_of(reader, Stage::kEntropies);
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

// The rate of the entropies' products: a KV group's query heads of a block of rows stacked
// (arguments: keys, rows).
void BM_GemmRateTall(benchmark::State& state) {
  measure_gemm_rate(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
}

// BM_GemmRate with `keys` keys (and BM_GemmRateTall with `rows` rows when given): the median of
// five runs of at least `seconds` each (a single one-second run moved by ±15% between runs, and
// every floor with it).
void register_gemm_rate(int keys, double seconds, int rows = 0) {
  auto* b =
      rows > 0
          ? benchmark::RegisterBenchmark("BM_GemmRateTall", BM_GemmRateTall)->Args({keys, rows})
          : benchmark::RegisterBenchmark("BM_GemmRate", BM_GemmRate)->Arg(keys);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(seconds)->Repetitions(5);
}

// The rates the floors of a sample read: with P, P / 2, P / 4 and P / 8 keys (its causal blocks
// have from 64 to P keys; those under P / 8 hold 1.6% of the products), and the entropies'
// stacked rows against P keys.
void register_gemm_rates(const kvsim::TraceInfo& info, int P) {
  for (int keys : {P, P / 2, P / 4, P / 8})
    if (keys >= 64 && !registered_rates.count(keys)) {
      registered_rates.insert(keys);
      register_gemm_rate(keys, 1.0);
    }
  const int group = info.num_heads / info.num_kv_heads;
  register_gemm_rate(P, 1.0, group * kvsim::entropy_block_rows(info.num_heads, P));
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
      if (name.rfind("BM_GemmRateTall", 0) == 0)
        tall_gflops[arg] = r.counters.at("GFLOPs");
      else if (name.rfind("BM_GemmRate", 0) == 0)
        gemm_gflops[arg] = r.counters.at("GFLOPs");
    }
  }
};

// --floors: each stage's products at the GEMM rates measured here (rate_at their key counts),
// with the rate they come to on average; the compact replay's as of `compact` when given, else
// of a compact trace this kvsim writes.
int print_floors(const fs::path& trace, const fs::path& compact) {
  const kvsim::TraceReader reader(trace);
  register_gemm_rates(reader.info(), reader.read_sample(reader.sample_names().front()).prompt_len);
  Collector reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("stage,gflop,gemm_gflops_per_s,floor_seconds\n");
  const auto row = [](const char* stage, double gflop, double seconds) {
    if (seconds > 0)
      std::printf("%s,%.4f,%.1f,%.4f\n", stage, gflop, gflop / seconds, seconds);
    else  // no rate measured (a --benchmark_filter left them out): the products alone
      std::printf("%s,%.4f,,\n", stage, gflop);
  };
  const auto products_row = [&row](const char* stage, const Products& products) {
    row(stage, total_gflop(products), floor_seconds(products));
  };
  const Products compaction = products_of(reader, Stage::kCompaction),
                 entropies = products_of(reader, Stage::kEntropies);
  products_row("full_replay", products_of(reader, Stage::kFullReplay));
  products_row("compaction", compaction);
  row("compaction_with_entropies", total_gflop(compaction) + total_gflop(entropies),
      floor_seconds(compaction) + floor_seconds(entropies, tall_gflops));
  products_row("compact_replay", products_of(reader, Stage::kCompactReplay,
                                             compact.empty() || stores_decode_results(compact),
                                             compact.empty() || stores_window_statistics(compact)));
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
    register_gemm_rates(kvsim::TraceReader(full_path(p)).info(), measured[p].prompt_len);
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
    const double floor = floor_seconds(m.full);
    std::printf("%8d %10.3f %10.3f %8.1fx %10.3f %10.2fx %11.2f %10.1f %10.1f %8.3f\n",
                m.prompt_len, m.full_s, m.compact_s, m.compact_s > 0 ? m.full_s / m.compact_s : 0,
                floor, floor > 0 ? m.full_s / floor : 0, m.compaction_s, m.full_bytes / 1048576.0,
                m.compact_bytes / 1048576.0,
                m.full_bytes ? static_cast<double>(m.compact_bytes) / m.full_bytes : 0);
  }
  std::printf(
      "(floor: each product at the single-precision GEMM rate on %d threads measured above "
      "with its key count, interpolated between P / 8, P / 4, P / 2 and P keys)\n",
      hardware_threads());
  std::printf("\n%8s %12s %10s %11s %14s %10s %11s\n", "P", "compaction s", "floor s",
              "comp./floor", "+entropies s", "floor s", "+ent./floor");
  for (int p : prompts) {
    const Measured& m = measured[p];
    const double floor = floor_seconds(m.compaction);
    const double entropies = floor_seconds(m.entropies, tall_gflops);
    const double with = floor > 0 && entropies > 0 ? floor + entropies : 0;
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
