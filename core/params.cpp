#include "core/params.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/suggest.hpp"

namespace kvsim {

namespace {

bool parse_double(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

bool parse_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "1" || s == "yes" || s == "on") return out = true, true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return out = false, true;
  return false;
}

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Rounding parse_rounding(const std::string& name) {
  if (name == "ceil") return Rounding::kCeil;
  if (name == "floor") return Rounding::kFloor;
  if (name == "round") return Rounding::kRound;
  if (name == "kvpress") return Rounding::kKvpress;
  throw std::invalid_argument("unknown budget rounding '" + name +
                              "' (known: ceil, floor, round, kvpress)");
}

double Size::unrounded(int base, Rounding rounding) const {
  if (removed) return base * (1.0 - value);
  if (!percent) return value;
  const double r = value / 100.0;  // correctly rounded: the double Python parses from "0.2"
  return rounding == Rounding::kKvpress ? base * (1.0 - (1.0 - r)) : base * r;
}

int Size::resolve(int base, Rounding rounding) const {
  const double x = unrounded(base, rounding);
  if (removed || !percent) return static_cast<int>(x);
  switch (rounding) {
    case Rounding::kFloor:
    case Rounding::kKvpress:
      return static_cast<int>(x);  // Python's int(): truncation, no tolerance
    case Rounding::kRound:
      return static_cast<int>(std::nearbyint(x));  // the default mode rounds half to even
    case Rounding::kCeil:
      break;
  }
  // Subtract a hair before ceil so that 20% of 640 is 128, not 129 through rounding noise.
  return static_cast<int>(std::ceil(x - 1e-9));
}

std::string Size::str() const {
  if (removed) return std::string(kCompressionRatioPrefix) + fmt(value);
  return percent ? fmt(value) + "%" : fmt(value);
}

Size Size::parse(const std::string& text) {
  Size s;
  if (text.rfind(kCompressionRatioPrefix, 0) == 0) {
    s.removed = true;
    if (!parse_double(text.substr(std::string(kCompressionRatioPrefix).size()), s.value) ||
        s.value < 0 || s.value >= 1)
      throw std::invalid_argument("'" + text + "' is not a compression ratio in [0, 1) (e.g. " +
                                  kCompressionRatioPrefix + "0.8, which removes 80%)");
    return s;
  }
  std::string body = text;
  if (!body.empty() && body.back() == '%') {
    s.percent = true;
    body.pop_back();
  }
  if (!parse_double(body, s.value) || s.value < 0 ||
      (!s.percent && (s.value != std::floor(s.value) || s.value > (1 << 30))) ||
      (s.percent && s.value > 100))
    throw std::invalid_argument("'" + text +
                                "' is not a count (e.g. 128, at most 2^30) or a percentage in "
                                "[0%, 100%] (e.g. 20%)");
  return s;
}

std::vector<ParamSpec> concat(std::vector<ParamSpec> a, const std::vector<ParamSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string param_type_name(const ParamSpec& spec) {
  switch (spec.type) {
    case ParamType::kInt:
      return "int";
    case ParamType::kFloat: {
      std::string s = "float";
      for (const auto& c : spec.choices) s += "|" + c;
      return s;
    }
    case ParamType::kBool:
      return "bool";
    case ParamType::kString:
      return "string";
    case ParamType::kSize: {
      std::string s = "count|percent";
      for (const auto& c : spec.choices) s += "|" + c;
      return s;
    }
    case ParamType::kChoice: {
      std::string s;
      for (const auto& c : spec.choices) s += (s.empty() ? "" : "|") + c;
      return s;
    }
  }
  return "?";
}

namespace {

void check_value(const std::string& owner, const ParamSpec& spec, const std::string& value) {
  auto fail = [&](const std::string& rule) {
    throw std::invalid_argument(owner + ": parameter '" + spec.name + "' = '" + value + "' " +
                                rule);
  };
  double x = 0;
  bool b = false;
  switch (spec.type) {
    case ParamType::kInt:
      if (!parse_double(value, x) || x != std::floor(x)) fail("is not an integer");
      if (x < spec.min || x > spec.max)
        fail("is out of range [" + fmt(spec.min) + ", " + fmt(spec.max) + "]");
      break;
    case ParamType::kFloat:
      if (std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end()) break;
      if (!parse_double(value, x)) fail("is not a number");
      if (x < spec.min || x > spec.max)
        fail("is out of range [" + fmt(spec.min) + ", " + fmt(spec.max) + "]");
      break;
    case ParamType::kBool:
      if (!parse_bool(value, b)) fail("is not a boolean (true/false)");
      break;
    case ParamType::kString:
      if (spec.check)
        if (const std::string why = spec.check(value); !why.empty()) fail(why);
      break;
    case ParamType::kChoice:
      if (std::find(spec.choices.begin(), spec.choices.end(), value) == spec.choices.end())
        fail("is not one of " + param_type_name(spec));
      break;
    case ParamType::kSize: {
      if (std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end()) break;
      Size s;
      try {
        s = Size::parse(value);
      } catch (const std::invalid_argument& e) {
        fail(std::string("is invalid: ") + e.what());
      }
      if (!s.percent && !s.removed && (s.value < spec.min || s.value > spec.max))
        fail("is out of range [" + fmt(spec.min) + ", " + fmt(spec.max) + "]");
      break;
    }
  }
}

}  // namespace

ParamSet resolve_params(const std::string& owner, const std::vector<ParamSpec>& specs,
                        const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> values;
  for (const auto& s : specs) values[s.name] = s.default_value;
  for (const auto& [key, value] : overrides) {
    const std::string& name = key;  // clang 14 cannot capture a structured binding
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&](const ParamSpec& s) { return s.name == name; });
    if (it == specs.end()) {
      std::string valid;
      std::vector<std::string> names;
      for (const auto& s : specs) {
        valid += (valid.empty() ? "" : ", ") + s.name;
        names.push_back(s.name);
      }
      throw std::invalid_argument(owner + ": unknown parameter '" + key + "'" +
                                  did_you_mean(key, names) +
                                  " (valid: " + (valid.empty() ? "none" : valid) + ")");
    }
    check_value(owner, *it, value);
    values[key] = value;
  }
  for (const auto& s : specs) check_value(owner, s, values[s.name]);
  return ParamSet(owner, std::move(values));
}

namespace {
const std::string& lookup(const std::string& owner, const std::map<std::string, std::string>& v,
                          const std::string& key) {
  auto it = v.find(key);
  if (it == v.end()) throw std::logic_error(owner + ": undeclared parameter '" + key + "' read");
  return it->second;
}
}  // namespace

long ParamSet::get_int(const std::string& key) const {
  return std::lround(std::strtod(lookup(owner_, values_, key).c_str(), nullptr));
}
double ParamSet::get_float(const std::string& key) const {
  return std::strtod(lookup(owner_, values_, key).c_str(), nullptr);
}
bool ParamSet::get_bool(const std::string& key) const {
  bool b = false;
  parse_bool(lookup(owner_, values_, key), b);
  return b;
}
const std::string& ParamSet::get_string(const std::string& key) const {
  return lookup(owner_, values_, key);
}
Size ParamSet::get_size(const std::string& key) const {
  return Size::parse(lookup(owner_, values_, key));
}

std::string ParamSet::str() const {
  std::string s;
  for (const auto& [k, v] : values_) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

}  // namespace kvsim
