// Typed, validated policy parameters (declared by each policy, set by --set / --config).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvsim {

enum class ParamType {
  kInt,     // integer in [min, max]
  kFloat,   // real in [min, max]
  kBool,    // true/false/1/0
  kChoice,  // one of `choices`
  kString,  // free text, parsed and checked by the policy that declares it
  kSize,    // a count ("128") or a percentage of a base the parameter names ("20%")
};

struct ParamSpec {
  std::string name;
  ParamType type;
  std::string default_value;
  std::string doc;
  double min = 0;
  double max = 1e18;
  std::vector<std::string> choices;  // kChoice; special values of kSize and kFloat
  // kString: returns what is wrong with a value, or "" when it is valid (checked with the rest,
  // before any replay starts).
  std::function<std::string(const std::string&)> check;
};

// A count, a percentage, or kvpress's compression ratio (the fraction removed), resolved against a
// base (the prompt length for budgets).
inline constexpr const char* kCompressionRatioPrefix = "compression_ratio:";
// How a percentage becomes whole entries; each reference repository has its own (policies'
// `budget_rounding`). r = the percentage / 100 and P the base, all in double as Python computes:
//   ceil     kvsim's: ceil(r·P) (a hair below, so that 20% of 640 is 128)
//   floor    int(r·P), as H2O's and LOOK-M's code size each of their parts
//   round    Python's round(P·r), half to even (KVCache-Factory run_longbench.py)
//   kvpress  int(P·(1 − R)) with R = 1 − r, the compression ratio that keeps r: 0.2 of 640
//            keeps 127 (kvpress/presses/scorer_press.py)
enum class Rounding { kCeil, kFloor, kRound, kKvpress };
Rounding parse_rounding(const std::string& name);  // throws std::invalid_argument
struct Size {
  bool percent = false;
  bool removed = false;  // "compression_ratio:R": keeps int(base · (1 − R)), as kvpress does
  double value = 0;
  // Percentages round up: 20% of P keeps ceil(0.2 P) entries. A compression ratio rounds down in
  // double arithmetic exactly as kvpress's ScorerPress (kvpress/presses/scorer_press.py,
  // n_kept = int(k_len * (1 - compression_ratio))): 0.8 of 640 keeps 127.
  int resolve(int base, Rounding rounding = Rounding::kCeil) const;
  // The entries before any rounding (kvpress's PyramidKVPress sizes layers from it); under
  // kKvpress a percentage goes through its compression ratio as kvpress's arithmetic does.
  double unrounded(int base, Rounding rounding = Rounding::kCeil) const;
  std::string str() const;
  static Size parse(const std::string& text);  // throws std::invalid_argument
};

// The fully resolved parameters of one policy instance: every declared key has a value.
class ParamSet {
 public:
  ParamSet() = default;
  ParamSet(std::string owner, std::map<std::string, std::string> values)
      : owner_(std::move(owner)), values_(std::move(values)) {}
  long get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  Size get_size(const std::string& key) const;
  const std::map<std::string, std::string>& values() const { return values_; }
  const std::string& owner() const { return owner_; }
  // "key=value,key=value" in key order; stable, used in results and decision dumps.
  std::string str() const;

 private:
  std::string owner_;
  std::map<std::string, std::string> values_;
};

// Applies overrides on top of the specs' defaults; every override key must be declared and every
// value valid. Errors (std::invalid_argument) name the owner, the key, the value, the rule and,
// for unknown keys, the valid keys.
ParamSet resolve_params(const std::string& owner, const std::vector<ParamSpec>& specs,
                        const std::map<std::string, std::string>& overrides);

std::string param_type_name(const ParamSpec& spec);

// a followed by b (policies that share a group of parameter declarations).
std::vector<ParamSpec> concat(std::vector<ParamSpec> a, const std::vector<ParamSpec>& b);

}  // namespace kvsim
