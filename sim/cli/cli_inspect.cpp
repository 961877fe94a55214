#include <cstdio>

#include "sim/cli/cli.hpp"
#include "sim/run/progress.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::cli {

namespace {

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1 << 30)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else if (b >= 1 << 20)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  return buf;
}

void print_sample(const TraceReader& reader, const SampleInfo& s) {
  int modality[3] = {0, 0, 0}, segment[3] = {0, 0, 0};
  for (auto m : s.modality) ++modality[m];
  for (auto g : s.segment) ++segment[g];
  int media = 0;
  for (auto id : s.media_id) media = std::max(media, id + 1);
  const auto bytes = reader.stored_bytes(s.name);
  std::printf(
      "  sample %-10s P=%-6d G=%-5d T=%-6d text=%d image=%d video=%d | system=%d user=%d "
      "generated=%d | media=%s | v=%s | %s, %s | %s stored%s%s%s\n",
      s.name.c_str(), s.prompt_len, s.gen_len, s.total_len(), modality[0], modality[1], modality[2],
      segment[0], segment[1], segment[2], s.media_id.empty() ? "-" : std::to_string(media).c_str(),
      s.has_v ? "yes" : "no", dtype_name(s.dtype), reader.storage_layout(s.name).c_str(),
      human_bytes(static_cast<double>(bytes)).c_str(),
      s.task.empty() ? "" : " | task=", s.task.c_str(),
      reader.info().compact()
          ? (" | queries from row " + std::to_string(s.compact_first_row) +
             (s.compact_context_len ? ", context " + std::to_string(s.compact_context_len) : ""))
                .c_str()
          : "");
}

}  // namespace

Runner add_inspect(CLI::App& app) {
  app.description(
      "Print a summary of a kvtrace v1 file (model, shapes, samples, modality and segment "
      "counts, bytes; for a compact trace, which statistics it holds) and validate everything the "
      "format requires: attributes, shapes, GQA "
      "divisibility, segments against prompt_len, and every q/k/v value (NaN/Inf), layer by "
      "layer. Exits non-zero with a message naming the file, sample and dataset on the first "
      "violation.");
  app.footer("Example:\n  kvsim inspect demo.h5");
  auto path = std::make_shared<std::string>();
  auto quick = std::make_shared<bool>(false);
  app.add_option("file", *path, "kvtrace file")->required();
  app.add_flag("--quick", *quick, "Check metadata only; do not read the q/k/v tensors");
  return [=] {
    TraceReader reader(*path);
    const TraceInfo& info = reader.info();
    std::printf(
        "%s\n  kvtrace v1, model '%s'\n  layers L=%d, heads H=%d, KV heads Hkv=%d%s, head_dim "
        "d=%d, "
        "scale=%g%s\n  samples: %zu\n",
        path->c_str(), info.model.c_str(), info.num_layers, info.num_heads, info.num_kv_heads,
        info.num_kv_heads < info.num_heads ? " (GQA)" : "", info.head_dim, info.scale,
        info.scale_given ? "" : " (default 1/sqrt(d))", reader.sample_names().size());
    if (info.compact())
      std::printf(
          "  compact trace: prompt queries kept for windows up to %d rows (from each sample's "
          "compact_first_row); stored per layer: prefill column sums and their dtype-rounded "
          "twin, text-query column sums and maxima (of the prompt, and of the context before the "
          "question)%s; not held: the other prompt queries, the ε-sparsity counts%s\n",
          info.compact_window, info.compact_entropies ? ", prompt entropies" : "",
          info.compact_entropies ? "" : ", the prompt entropies");
    std::vector<SampleInfo> samples;
    for (const auto& name : reader.sample_names()) {
      samples.push_back(reader.read_sample(name));
      print_sample(reader, samples.back());
    }
    if (*quick) {
      std::printf("metadata valid (tensors not read: --quick)\n");
      return 0;
    }
    Progress progress(static_cast<long>(samples.size()) * info.num_layers, "inspect");
    for (const auto& s : samples)
      for (int l = 0; l < info.num_layers; ++l) {
        reader.read_layer(s, l);
        progress.advance();
      }
    progress.finish();
    std::printf("valid: every attribute, shape and q/k/v value checked\n");
    return 0;
  };
}

}  // namespace kvsim::cli
