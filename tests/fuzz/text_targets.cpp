// Fuzz targets over kvsim's text inputs: safetensors headers, config.json, INI files and the
// command line's --set / --grid / budget / size values.
#include <map>
#include <sstream>
#include <stdexcept>

#include "analysis/comparison.hpp"
#include "analysis/csv_table.hpp"
#include "analysis/prediction_card.hpp"
#include "core/params.hpp"
#include "policies/policy_config.hpp"
#include "sim/live/checkpoint.hpp"
#include "sim/replay/sweep.hpp"
#include "tests/fuzz/byte_source.hpp"
#include "tests/fuzz/targets.hpp"

namespace kvsim::fuzz {

void safetensors(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, live::HostTensor> tensors;
  try {
    live::parse_safetensors(reinterpret_cast<const char*>(data), size, "fuzz.safetensors", tensors);
  } catch (const live::CheckpointError&) {
  }
}

void config_json(const std::uint8_t* data, std::size_t size) {
  try {
    const live::ModelConfig c =
        live::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "c.json");
    live::expected_tensors(c);
  } catch (const live::CheckpointError&) {
  }
}

namespace {

// The policies whose parameters the value fuzzers resolve: one of each parameter type.
const char* const kPolicies[] = {"h2o", "snapkv", "hae", "st3", "madakv", "meda", "avl", "lookm"};

std::map<std::string, std::string> key_values(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ';')) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return kv;
}

}  // namespace

void ini_config(const std::uint8_t* data, std::size_t size) {
  ByteSource in(data, size);
  const bool sweep = in.pick(2);
  std::istringstream text(in.rest());
  try {
    if (sweep) {
      const SweepFile f = read_sweep_file(text, "fuzz.ini");
      sweep_configs(f.policies, f.grids, f.sets, f.budget);
    } else {
      for (const auto& [name, kv] : read_policy_config(text, "fuzz.ini"))
        make_policy_config(name, kv);
    }
  } catch (const std::invalid_argument&) {
  }
}

void cli_values(const std::uint8_t* data, std::size_t size) {
  ByteSource in(data, size);
  const int which = in.pick(5);
  const char* policy = kPolicies[in.pick(sizeof kPolicies / sizeof *kPolicies)];
  const int base = 1 + in.pick(4096);
  const std::string text = in.rest();
  try {
    switch (which) {
      case 0: {
        PolicyOverrides o;
        apply_set_option(text, o);
        for (const auto& [name, kv] : o) make_policy_config(name, kv);
        break;
      }
      case 1:
        sweep_configs({policy}, {text}, {}, "");
        break;
      case 2: {
        const Size s = Size::parse(text);
        s.resolve(base);
        s.str();
        break;
      }
      case 3: {
        // The parameters, then a policy built from them for a prompt of `base` tokens.
        const PolicyConfig c = make_policy_config(policy, key_values(text));
        c.needs();
        SampleInfo s;
        s.name = "fuzz";
        s.prompt_len = base;
        s.gen_len = 4;
        for (int i = 0; i < base + 4; ++i) {
          const bool image = i >= base / 4 && i < base / 2;
          s.modality.push_back(image ? 1 : 0);
          s.segment.push_back(i < base ? 1 : 2);
          s.media_id.push_back(image ? 0 : -1);
        }
        c.info->create(c.params, s);
        for (int l = 0; l < 4; ++l) c.attention_source(l);
        break;
      }
      default:
        sweep_configs({policy, "full"}, {}, {}, text);
        break;
    }
  } catch (const std::invalid_argument&) {
  }
}

void result_table(const std::uint8_t* data, std::size_t size) {
  ByteSource in(data, size);
  const bool card = in.pick(2);
  const std::string text = in.rest();
  try {
    if (card) {
      const PredictionCard c = parse_prediction_card(text, "fuzz.json");
      c.predict(0.3);
      return;
    }
    // kvsim compare on the table: the third column as the metric, the first policy the reference.
    const CsvTable t = parse_csv_table(text, "fuzz.csv");
    if (t.header.size() < 3) return;
    const std::string metric = t.header[2];
    const SampleTable table =
        per_sample_values(t.strings(t.header[0]), t.strings(t.header[1]), t.numbers(metric));
    if (table.policies.empty()) return;
    PairedOptions o;
    o.bootstrap.resamples = 50;
    o.permutations = 100;
    o.exact_up_to = 8;
    compare_to_reference(table, metric, table.policies[0], {}, o);
  } catch (const std::invalid_argument&) {
  }
}

}  // namespace kvsim::fuzz
