// `kvsim live`: checkpoints and prompt files in, kvtrace files and end-to-end accuracy out.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "core/partial_files.hpp"
#include "policies/policy_config.hpp"
#include "sim/cli/cli.hpp"
#include "sim/live/evaluate.hpp"
#include "sim/live/pieces.hpp"
#include "sim/replay/results.hpp"
#include "sim/replay/sweep.hpp"
#include "sim/run/mpi_world.hpp"
#include "sim/run/output_guard.hpp"
#include "sim/run/progress.hpp"

namespace kvsim::cli {

namespace {

struct ModelArgs {
  std::string out, arch = "llama", dtype = "float32";
  int layers = 2, hidden = 64, intermediate = 128, heads = 4, kv_heads = 2, head_dim = 0,
      vocab = 256, shards = 1;
  double rope_theta = 10000.0, std = 0.05;
  bool tie = false;
  std::uint64_t seed = 1;
};

struct PromptArgs {
  std::string out;
  int samples = 2, prompt_len = 48, image_tokens = 24, vocab = 256, embed_dim = 0,
      reference_len = 0;
  std::uint64_t seed = 1;
  bool force = false;  // replace an existing prompt file
};

struct RunArgs {
  std::string model, prompts, backend = "cpu", out, summary, config, budget, dtype = "float32";
  std::string tokenizer;  // evaluate: the vocabulary that decodes answers (default: the model's)
  std::vector<std::string> samples, policies, sets;
  int gen = 32;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int seeds = kDefaultSeeds;
  bool equal_memory = false;
  std::string prompt_tail;  // live evaluate --prompt-tail
  bool force_reference = false, no_timing = false, logits = false, beyond_positions = false;
  bool compact = false, no_entropies = false;  // capture: a compact trace
  int compact_window = 0;
  bool stop_at_eos = false;
  bool force = false;  // capture: replace an existing kvtrace file
};

// The files a run reads, which none of its outputs may be.
std::vector<InputPath> run_inputs(const RunArgs& a) {
  return {{a.model, "model"},
          {a.prompts, "prompt file"},
          {a.config, "config"},
          {a.tokenizer, "tokenizer"}};
}

// --stop-at-eos: the checkpoint's end-of-sequence ids (none without the flag).
std::vector<std::int32_t> stop_tokens(const RunArgs& a) {
  if (!a.stop_at_eos) return {};
  std::vector<std::int32_t> ids = live::read_eos_token_ids(a.model);
  if (ids.empty())
    throw std::invalid_argument(
        "--stop-at-eos: neither generation_config.json nor config.json in " + a.model +
        " gives an eos_token_id");
  return ids;
}

live::WeightDType parse_weight_dtype(const std::string& s) {
  if (s == "bfloat16" || s == "bf16") return live::WeightDType::kBFloat16;
  if (s == "float16" || s == "fp16") return live::WeightDType::kFloat16;
  return live::WeightDType::kFloat32;
}

void add_make_model(CLI::App& app, ModelArgs& a) {
  app.add_option("-o,--out", a.out, "Checkpoint directory to create")->required();
  app.add_option("--arch", a.arch, "model_type")
      ->check(CLI::IsMember({"llama", "mistral", "qwen2"}))
      ->capture_default_str();
  app.add_option("--layers", a.layers, "num_hidden_layers")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--hidden", a.hidden, "hidden_size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--intermediate", a.intermediate, "intermediate_size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", a.heads, "num_attention_heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", a.kv_heads, "num_key_value_heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--head-dim", a.head_dim, "head_dim (default hidden / heads)");
  app.add_option("--vocab", a.vocab, "vocab_size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rope-theta", a.rope_theta, "rope_theta")->capture_default_str();
  app.add_option("--dtype", a.dtype, "Stored weight type (bf16, fp16, fp32 also accepted)")
      ->check(CLI::IsMember({"bfloat16", "float16", "float32", "bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--shards", a.shards, "Safetensors shards (>1 writes the index file)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--std", a.std, "Standard deviation of the random weights")->capture_default_str();
  app.add_flag("--tie", a.tie, "tie_word_embeddings (no lm_head.weight)");
  app.add_option("--seed", a.seed, "Random seed")->capture_default_str();
}

int run_make_model(const ModelArgs& a) {
  live::ModelConfig c;
  c.model_type = a.arch;
  c.hidden_size = a.hidden;
  c.intermediate_size = a.intermediate;
  c.num_hidden_layers = a.layers;
  c.num_attention_heads = a.heads;
  c.num_key_value_heads = a.kv_heads;
  c.head_dim = a.head_dim > 0 ? a.head_dim : a.hidden / a.heads;
  c.vocab_size = a.vocab;
  c.rope_theta = a.rope_theta;
  c.tie_word_embeddings = a.tie;
  c.qkv_bias = a.arch == "qwen2";
  c.max_position_embeddings = 32768;
  if (a.heads % a.kv_heads != 0 || c.head_dim % 2 != 0)
    throw std::invalid_argument("--heads must be a multiple of --kv-heads, head_dim even");
  live::write_random_checkpoint(a.out, c, parse_weight_dtype(a.dtype), a.shards, a.seed, a.std);
  std::printf("%s: random %s checkpoint, %d layers, hidden %d, %d/%d heads, vocab %d, %s\n",
              a.out.c_str(), a.arch.c_str(), a.layers, a.hidden, a.heads, a.kv_heads, a.vocab,
              a.dtype.c_str());
  return 0;
}

void add_make_prompt(CLI::App& app, PromptArgs& a) {
  app.add_option("-o,--out", a.out, "Prompt file to write (kvprompt v1)")->required();
  app.add_flag("--force", a.force, "Replace an existing prompt file at --out");
  app.add_option("--samples", a.samples, "Samples")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prompt-len", a.prompt_len, "Prompt tokens per sample")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--image-tokens", a.image_tokens, "Image positions after a 4-token system prefix")
      ->capture_default_str();
  app.add_option("--vocab", a.vocab, "Token ids are drawn from [0, vocab)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--embed-dim", a.embed_dim,
                 "Write random inputs_embeds rows of this width for the image positions "
                 "(the model's hidden_size); 0: image positions use their token ids")
      ->capture_default_str();
  app.add_option("--reference-len", a.reference_len, "Random reference_ids per sample")
      ->capture_default_str();
  app.add_option("--seed", a.seed, "Random seed")->capture_default_str();
}

int run_make_prompt(const PromptArgs& a) {
  if (a.image_tokens < 0 || 4 + a.image_tokens >= a.prompt_len)
    throw std::invalid_argument(
        "--image-tokens must leave room for 4 system tokens and a "
        "text question within --prompt-len");
  std::mt19937_64 rng(a.seed);
  std::uniform_int_distribution<int> token(0, a.vocab - 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<PromptSample> samples;
  for (int i = 0; i < a.samples; ++i) {
    PromptSample s;
    char name[16];
    std::snprintf(name, sizeof name, "%06d", i);
    s.info.name = name;
    s.info.prompt_len = a.prompt_len;
    for (int p = 0; p < a.prompt_len; ++p) {
      const bool image = p >= 4 && p < 4 + a.image_tokens;
      s.info.token_ids.push_back(token(rng));
      s.info.modality.push_back(image ? 1 : 0);
      s.info.segment.push_back(p < 4 ? 0 : 1);
      s.info.media_id.push_back(image ? 0 : -1);
    }
    s.info.question_len = a.prompt_len - 4 - a.image_tokens;  // the text after the image
    if (a.embed_dim > 0) {
      s.embed_dim = a.embed_dim;
      for (int r = 0; r < a.image_tokens * a.embed_dim; ++r) s.inputs_embeds.push_back(normal(rng));
    }
    for (int r = 0; r < a.reference_len; ++r) s.reference_ids.push_back(token(rng));
    samples.push_back(std::move(s));
  }
  check_outputs({{a.out, "--out", OutputKind::prompts}}, {}, a.force);
  write_prompt_file(begin_partial(a.out), samples, "random");
  publish(a.out);
  std::printf("%s: %d prompt(s) of %d tokens, %d image positions%s\n", a.out.c_str(), a.samples,
              a.prompt_len, a.image_tokens, a.embed_dim > 0 ? " with inputs_embeds" : "");
  return 0;
}

void add_model_options(CLI::App& app, RunArgs& a) {
  app.add_option("-m,--model", a.model,
                 "Hugging Face checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--prompts", a.prompts,
                 "Prompt file (kvprompt v1, docs/live.md, \"Prompt files\")")
      ->required();
  app.add_option("-s,--sample", a.samples, "Sample name (repeatable; default: every sample)");
  app.add_option("--gen", a.gen, "Decode steps per prompt")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", a.backend, "Where the model runs")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--stop-at-eos", a.stop_at_eos,
               "End a greedy answer at the model's end-of-sequence token (eos_token_id of "
               "generation_config.json, else config.json), included; --gen is then the most");
  app.add_flag("--allow-beyond-max-positions", a.beyond_positions,
               "Run prompts whose prompt + decode steps exceed the model's "
               "max_position_embeddings (refused otherwise: the model was not trained there)");
  add_threads_option(app, a.threads, "Threads for the prompt statistics");
}

// Every sample fits the model before any work (live::check_prompt_fits_model, errors naming the
// prompt file, the sample and the model). Returns how many samples carry a reference answer.
int check_prompts_fit_model(const PromptReader& prompts, const std::vector<std::string>& samples,
                            const live::ModelConfig& c, const std::string& model) {
  int with_reference = 0;
  for (const auto& name : samples) {
    const PromptSample p = prompts.read(name);
    live::check_prompt_fits_model(p, c, prompts.path() + ", sample '" + name + "': ", model);
    with_reference += !p.info.reference.empty();
  }
  return with_reference;
}

struct Session {
  live::Checkpoint checkpoint;
  std::unique_ptr<live::Backend> backend;
  std::unique_ptr<live::Model> model;
  std::unique_ptr<live::LiveEngine> engine;
  std::unique_ptr<PromptReader> prompts;
  std::vector<std::string> samples;
  Session(const RunArgs& a, int device) {
    checkpoint = live::load_checkpoint(a.model);
    backend = live::make_backend(a.backend, device);
    model = std::make_unique<live::Model>(checkpoint, *backend);
    checkpoint.tensors.clear();  // the backend holds its own copy
    engine = std::make_unique<live::LiveEngine>(*model, a.threads);
    engine->allow_beyond_max_positions(a.beyond_positions);
    prompts = std::make_unique<PromptReader>(a.prompts);
    samples = a.samples.empty() ? prompts->sample_names() : a.samples;
    check_shared_contexts(*prompts, samples);  // several questions on one context
    with_reference = check_prompts_fit_model(*prompts, samples, model->config(), a.model);
  }
  int with_reference = 0;  // samples whose prompt carries a reference answer
  // Which samples this rank runs: all of them in one process; under mpirun a fixed split by
  // tokens (prompt + decode steps), the same on every rank.
  std::vector<bool> share(const World& world, int gen) const {
    std::vector<double> tokens;
    for (const auto& name : samples) tokens.push_back(prompts->prompt_len(name) + gen);
    const std::vector<int> owner = split_by_cost(tokens, world.size());
    std::vector<bool> here(samples.size());
    for (std::size_t i = 0; i < samples.size(); ++i) here[i] = owner[i] == world.rank();
    return here;
  }
};

long count_true(const std::vector<bool>& v) {
  return static_cast<long>(std::count(v.begin(), v.end(), true));
}

// What a failed rank leaves behind for a rerun.
std::string kept_pieces(const std::string& output) {
  return "the finished samples are kept in " + output +
         ".parts/; rerun the same command to compute only the rest";
}

// What a live run's results depend on besides its options: the checkpoint, the prompt file, the
// backend (CPU and CUDA round differently).
std::string run_identity(const RunArgs& a) {
  return live::fingerprint_of(
      {live::checkpoint_fingerprint(a.model), file_content_hash(a.prompts), a.backend});
}

std::string ranks_note(const World& world) {
  return world.distributed() ? ", " + std::to_string(world.size()) + " ranks" : "";
}

// Every rank captures its share into the piece store; once all have, rank 0 assembles the file.
int run_capture(const RunArgs& a, const World& world) {
  live::CaptureOptions o;
  o.gen_len = a.gen;
  o.stop_tokens = stop_tokens(a);
  o.force_reference = a.force_reference;
  o.dtype = a.dtype == "float16" ? DType::kFloat16 : DType::kFloat32;
  o.logits = a.logits;
  o.model_name = std::filesystem::path(a.model).filename().string();
  if (a.compact) {
    o.compact_window = a.compact_window > 0 ? a.compact_window : default_compact_window();
    o.compact_window_widths = default_window_widths(o.compact_window);
  }
  o.compact_entropies = !a.no_entropies;
  if (!a.compact && (a.compact_window > 0 || a.no_entropies))
    throw std::invalid_argument("--window and --no-entropies apply to --compact only");
  check_outputs({{a.out, "--out", OutputKind::trace}}, run_inputs(a), a.force);
  std::unique_ptr<Session> s;
  std::exception_ptr failed;
  try {
    o.fingerprint = run_identity(a);
    s = std::make_unique<Session>(a, world.local_rank());
    const std::vector<bool> here = s->share(world, a.gen);
    Progress progress(count_true(here), "live capture");
    o.on_sample = [&] { progress.advance(); };
    live::capture_samples(*s->engine, *s->prompts, s->samples, here, a.out, o);
    progress.finish();
  } catch (...) {
    failed = std::current_exception();
  }
  world.settle(failed, kept_pieces(a.out));
  if (world.rank() != 0) return 0;
  live::assemble_capture(*s->engine, s->samples, a.out, o);
  std::printf("%s: %zu sample(s) captured with a full cache (%s backend%s)\n", a.out.c_str(),
              s->samples.size(), a.backend.c_str(), ranks_note(world).c_str());
  return 0;
}

// One sample's rows of the three outputs of `live evaluate`, stored as one piece.
struct EvalText {
  std::string steps, summary, table;
  static constexpr const char* kSeparator = "#kvsim-piece-section\n";
  std::string str() const { return steps + kSeparator + summary + kSeparator + table; }
  static EvalText parse(const std::string& text, const std::string& path) {
    const std::string sep = kSeparator;
    const auto a = text.find(sep), b = a == std::string::npos ? a : text.find(sep, a + sep.size());
    if (b == std::string::npos)
      throw std::runtime_error(path +
                               ": not a piece of `kvsim live evaluate` (delete it to redo "
                               "the sample)");
    return {text.substr(0, a), text.substr(a + sep.size(), b - a - sep.size()),
            text.substr(b + sep.size())};
  }
  void append(const EvalText& o) {
    steps += o.steps;
    summary += o.summary;
    table += o.table;
  }
};

EvalText evaluate_sample(Session& s, const std::string& name,
                         const std::vector<PolicyConfig>& policies, const live::EvalOptions& o) {
  EvalText out;
  char line[256];
  for (const auto& r : live::evaluate_prompt(*s.engine, s.prompts->read(name), policies, o)) {
    live::append_eval_steps_csv(out.steps, r, o.timing);
    live::append_eval_summary_csv(out.summary, r, o.timing);
    // Without timing the listing has no latency column either (the result files have none).
    char ms[16] = "";
    if (o.timing) std::snprintf(ms, sizeof ms, " %9.3f", r.ms_per_token);
    std::snprintf(line, sizeof line, "%-24s %-10s %9.4g %7.3f %6d %8.3f %10.3f%s %7s\n",
                  r.label.c_str(), r.sample.c_str(), r.mean_kl, r.top1_agreement,
                  r.first_divergence, r.answer_overlap,
                  static_cast<double>(r.peak_kv_bytes) / r.full_peak_kv_bytes, ms,
                  !r.has_reference   ? "-"
                  : r.score.contains ? "yes"
                                     : "no");
    out.table += line;
  }
  return out;
}

// Finished samples are kept beside the first output named, under everything they depend on, so
// an interrupted run resumes and the ranks of an mpirun hand their samples to rank 0.
std::unique_ptr<live::PieceStore> evaluate_store(const RunArgs& a,
                                                 const std::vector<PolicyConfig>& policies,
                                                 const live::EvalOptions& o) {
  const std::string output = !a.out.empty() ? a.out : a.summary;
  if (output.empty()) return nullptr;
  std::vector<std::string> identity = {KVSIM_VERSION, run_identity(a), std::to_string(o.gen_len),
                                       std::to_string(o.timing)};
  for (const auto id : o.stop_tokens) identity.push_back("stop " + std::to_string(id));
  if (o.vocabulary) identity.push_back("vocabulary " + o.vocabulary->path());
  if (o.prompt_tail != 0) identity.push_back("prompt tail " + prompt_tail_text(o.prompt_tail));
  for (const auto& p : policies) identity.push_back(p.label + " " + p.params.str());
  return std::make_unique<live::PieceStore>(output, live::fingerprint_of(identity));
}

// `live evaluate` prints one row per (policy, sample) up to this many samples.
constexpr std::size_t kSamplesListed = 8;

live::EvalOptions eval_options(const RunArgs& a) {
  live::EvalOptions o;
  o.gen_len = a.gen;
  o.stop_tokens = stop_tokens(a);
  o.timing = !a.no_timing;
  o.prompt_tail = a.prompt_tail.empty() ? 0 : parse_prompt_tail(a.prompt_tail);
  return o;
}

// This rank's share of the samples evaluated: into the piece store, or without one (a single
// process without output files) into `in_memory`, by sample index.
void evaluate_share(const RunArgs& a, const World& world, Session& s,
                    const std::vector<PolicyConfig>& policies, const live::EvalOptions& o,
                    const live::PieceStore* store, std::map<std::size_t, EvalText>& in_memory) {
  if (!o.vocabulary && s.with_reference > 0 && world.rank() == 0)
    std::fprintf(stderr,
                 "kvsim: warning: %s has no vocabulary (vocab.json or tokenizer.json; "
                 "--tokenizer names one): the answers cannot be decoded, so answer accuracy "
                 "is left empty for the %d sample(s) with a reference answer\n",
                 a.model.c_str(), s.with_reference);
  const std::vector<bool> here = s.share(world, a.gen);
  Progress progress(count_true(here), "live evaluate");
  for (std::size_t i = 0; i < s.samples.size(); ++i) {
    if (!here[i]) continue;
    const std::string& name = s.samples[i];
    if (!store || !store->done(i, name)) {
      EvalText one = evaluate_sample(s, name, policies, o);
      if (store)
        write_whole(store->path(i, name), one.str());
      else
        in_memory[i] = std::move(one);
    }
    progress.advance();
  }
  progress.finish();
}

// Rank 0: every sample's text, in sample order, under the table's header.
EvalText gather_evaluation(const Session& s, const live::EvalOptions& o,
                           const live::PieceStore* store,
                           std::map<std::size_t, EvalText>& in_memory) {
  EvalText all{live::eval_steps_csv_header(), live::eval_summary_csv_header(), ""};
  char line[256];
  std::snprintf(line, sizeof line, "%-24s %-10s %9s %7s %6s %8s %10s%s %7s\n", "policy", "sample",
                "mean_kl", "top1", "diverge", "overlap", "kv_frac", o.timing ? "  ms/token" : "",
                "right");
  all.table += line;
  for (std::size_t i = 0; i < s.samples.size(); ++i) {
    const std::string& name = s.samples[i];
    all.append(in_memory.count(i)
                   ? in_memory[i]
                   : EvalText::parse(read_whole(store->path(i, name)), store->path(i, name)));
  }
  return all;
}

// Rank 0: the outputs and the console report of the whole evaluation.
void publish_evaluation(const RunArgs& a, const World& world, const Session& s,
                        const std::vector<PolicyConfig>& policies, const EvalText& all) {
  const live::EvalReport report = live::report_evaluation(all.summary, policies);
  // What the policies noted while running, in replay's words: on the console and in the sidecar.
  std::map<std::string, std::vector<std::string>> notes;
  for (const auto& [label, note] : report.notes) {
    std::fprintf(stderr, "kvsim: warning: %s\n", note.c_str());
    notes[label].push_back(note);
  }
  if (!a.out.empty()) {
    write_whole(a.out, all.steps);
    write_policies_sidecar(a.out, policies, notes);
  }
  if (!a.summary.empty()) write_whole(a.summary, report.summary_csv);
  std::printf(
      "%s on %s (%s backend%s), %d decode steps; mean_kl and top1 teacher-forced on the "
      "full-cache answer, diverge = first differing greedy token, right = the answer contains "
      "the reference\n",
      a.model.c_str(), a.prompts.c_str(), a.backend.c_str(), ranks_note(world).c_str(), a.gen);
  // Per (policy, sample) only for a handful of samples; the overall table always.
  if (s.samples.size() <= kSamplesListed)
    std::printf("%s", all.table.c_str());
  else
    std::printf("(%zu samples: one row per policy and sample in --summary and --out)\n",
                s.samples.size());
  std::printf("%s", report.table.c_str());
}

// Every rank evaluates its share of the samples into the piece store (a single process without
// output files keeps them in memory); once all have, rank 0 assembles the outputs in sample order.
int run_evaluate(const RunArgs& a, const World& world) {
  const std::vector<PolicyConfig> policies =
      resolve_policy_list(split_policy_list(a.policies), a.sets,
                          {.config = a.config,
                           .budget = a.budget,
                           .verb = "evaluated",
                           .seeds = a.seeds,
                           .equal_memory = a.equal_memory});
  const std::string output = !a.out.empty() ? a.out : a.summary;
  if (world.distributed() && output.empty())
    throw std::invalid_argument(
        "live evaluate under mpirun needs --out or --summary: the ranks hand their samples to "
        "rank 0 through files beside it");
  check_outputs({{a.out, "--out"},
                 {a.out.empty() ? "" : policies_sidecar_path(a.out), "--out's sidecar"},
                 {a.summary, "--summary"}},
                run_inputs(a));
  live::EvalOptions o = eval_options(a);
  const std::optional<live::Vocabulary> vocabulary =
      a.tokenizer.empty() ? live::Vocabulary::find(a.model) : live::Vocabulary::load(a.tokenizer);
  if (vocabulary) o.vocabulary = &*vocabulary;
  std::unique_ptr<Session> s;
  std::unique_ptr<live::PieceStore> store;
  std::map<std::size_t, EvalText> in_memory;
  std::exception_ptr failed;
  try {
    store = evaluate_store(a, policies, o);
    s = std::make_unique<Session>(a, world.local_rank());
    evaluate_share(a, world, *s, policies, o, store.get(), in_memory);
  } catch (...) {
    failed = std::current_exception();
  }
  world.settle(failed, kept_pieces(output));
  if (world.rank() != 0) return 0;
  const EvalText all = gather_evaluation(*s, o, store.get(), in_memory);
  publish_evaluation(a, world, *s, policies, all);
  if (store) store->clear();
  return 0;
}

}  // namespace

Runner add_live(CLI::App& app) {
  app.description(
      "The live path: run a Hugging Face decoder (LLaMA, Mistral, Qwen2) with eviction policies "
      "in the loop. capture writes kvtrace files for replay; evaluate measures end-to-end "
      "accuracy against the full cache. Both keep finished samples in OUTPUT.parts/ (a rerun "
      "resumes) and, built with MPI, `mpirun -n N kvsim live ...` splits the samples over the "
      "ranks (one GPU each) and writes the same files.");
  app.footer(
      "Examples:\n  kvsim live make-model -o model/\n  kvsim live make-prompt -o prompts.h5\n  "
      "kvsim live capture -m model/ --prompts prompts.h5 --gen 16 -o trace.h5\n  kvsim live "
      "evaluate -m model/ --prompts prompts.h5 -p h2o,snapkv --budget 50% --summary eval.csv");
  app.require_subcommand(1);
  auto model = std::make_shared<ModelArgs>();
  auto prompt = std::make_shared<PromptArgs>();
  auto run = std::make_shared<RunArgs>();
  CLI::App* mm = app.add_subcommand("make-model",
                                    "Write a random-initialised checkpoint in the "
                                    "Hugging Face layout (tests, demos)");
  add_make_model(*mm, *model);
  mm->footer("Example:\n  kvsim live make-model -o model/ --layers 2 --hidden 64");
  CLI::App* mp = app.add_subcommand("make-prompt", "Write a random prompt file (kvprompt v1)");
  add_make_prompt(*mp, *prompt);
  mp->footer("Example:\n  kvsim live make-prompt -o prompts.h5 --samples 2 --prompt-len 48");
  CLI::App* cap = app.add_subcommand(
      "capture", "Generate with a full cache and write every layer's q, k, v to a kvtrace file");
  add_model_options(*cap, *run);
  cap->footer("Example:\n  kvsim live capture -m model/ --prompts prompts.h5 --gen 16 -o trace.h5");
  cap->add_option("-o,--out", run->out, "kvtrace v1 file to write")->required();
  cap->add_flag("--force", run->force, "Replace an existing kvtrace file at --out");
  cap->add_option("--dtype", run->dtype, "Stored element type")
      ->check(CLI::IsMember({"float16", "float32"}))
      ->capture_default_str();
  cap->add_flag("--force-reference", run->force_reference,
                "Feed each prompt's reference_ids instead of the greedy answer (G = its length)");
  cap->add_flag("--logits", run->logits,
                "Also store samples/<name>/logits, float32 [G + 1, vocab] (comparisons with "
                "other implementations)");
  cap->add_flag("--compact", run->compact,
                "Write a compact trace (as kvsim compact makes): each sample's prompt statistics "
                "computed as it is captured, only the last prompt queries windows read stored");
  cap->add_option("--window", run->compact_window,
                  "With --compact: keep the queries of windows up to N prompt rows (default: the "
                  "longest any policy or preset reads at its defaults, at least 64)")
      ->check(CLI::PositiveNumber);
  cap->add_flag("--no-entropies", run->no_entropies,
                "With --compact: do not store the prompt entropies (MEDA is then refused)");
  CLI::App* ev =
      app.add_subcommand("evaluate",
                         "End-to-end accuracy of policies against the full-cache run: KL, top-1 "
                         "agreement, greedy divergence, reference log-likelihood, memory, latency");
  add_model_options(*ev, *run);
  ev->footer(
      "Example:\n  kvsim live evaluate -m model/ --prompts prompts.h5 -p h2o,snapkv --budget 50% "
      "--summary eval.csv");
  ev->add_option("-p,--policy", run->policies,
                 "Policy name (repeatable, or comma-separated; see `kvsim policies`)")
      ->required();
  ev->add_option("--set", run->sets,
                 "Parameter override NAME.key=value, or *.key=value for every policy with the key "
                 "(repeatable)");
  ev->add_option("--config", run->config, "INI file with one [NAME] section per policy");
  add_seeds_option(*ev, run->seeds);
  add_equal_memory_flag(*ev, run->equal_memory);
  ev->add_option("--budget", run->budget,
                 "Budget for every policy that has one and no explicit budget");
  add_prompt_tail_option(*ev, run->prompt_tail);
  ev->add_option("-o,--out", run->out, "Per-step results CSV (and NAME.policies.csv beside it)");
  ev->add_option("--summary", run->summary, "Per-(policy, sample) summary CSV");
  ev->add_option("--tokenizer", run->tokenizer,
                 "Vocabulary that decodes the answers for answer accuracy: a llama2.c vocab.json "
                 "or a tokenizer.json (default: the one in the model directory, if any)")
      ->check(CLI::ExistingFile);
  ev->add_flag("--no-timing", run->no_timing,
               "Leave the latency columns empty (byte-identical files across runs)");
  return [=, &app]() {
    if (mm->parsed()) return run_make_model(*model);
    if (mp->parsed()) return run_make_prompt(*prompt);
    const World world;  // the ranks of `mpirun -n N kvsim live ...`, or this process alone
    if (cap->parsed()) return run_capture(*run, world);
    return run_evaluate(*run, world);
  };
}

}  // namespace kvsim::cli
