#include "sim/live/answers.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

namespace kvsim::live {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\n\r\f\v") - first + 1);
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// COMMA_STRIP, (?<=\d)(\,)+(?=\d): a digit, one or more commas, a digit.
bool has_digit_comma_digit(const std::string& s) {
  for (std::size_t i = 1; i < s.size(); ++i) {
    if (s[i] != ',' || !is_digit(s[i - 1])) continue;
    std::size_t j = i;
    while (j < s.size() && s[j] == ',') ++j;
    if (j < s.size() && is_digit(s[j])) return true;
  }
  return false;
}

std::string process_punctuation(const std::string& in) {
  static const char* kPunctuation[] = {";", "/", "[", "]", "\"", "{", "}", "(", ")", "=", "+",
                                       "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"};
  const bool comma_strip = has_digit_comma_digit(in);
  std::string out = in;
  for (const char* p : kPunctuation) {
    const std::string mark = p;
    const bool touches_space = in.find(mark + " ") != std::string::npos ||
                               in.find(" " + mark) != std::string::npos;
    replace_all(out, mark, touches_space || comma_strip ? "" : " ");
  }
  // PERIOD_STRIP, (?!<=\d)(\.)(?!\d): its first group is a lookahead for the literal "<=" and a
  // digit, which never matches at a '.', so every '.' not followed by a digit goes.
  std::string kept;
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] != '.' || (i + 1 < out.size() && is_digit(out[i + 1]))) kept += out[i];
  return kept;
}

std::string process_digit_article(const std::string& in) {
  static const std::map<std::string, std::string> kNumbers = {
      {"none", "0"}, {"zero", "0"}, {"one", "1"}, {"two", "2"},   {"three", "3"}, {"four", "4"},
      {"five", "5"}, {"six", "6"},  {"seven", "7"}, {"eight", "8"}, {"nine", "9"},  {"ten", "10"}};
  std::istringstream words(in);
  std::string word, out;
  while (words >> word) {
    const auto n = kNumbers.find(word);
    if (n != kNumbers.end()) word = n->second;
    if (word == "a" || word == "an" || word == "the") continue;
    out += (out.empty() ? "" : " ") + word;
  }
  return out;
}

}  // namespace

std::string normalize_vqa_answer(const std::string& text) {
  std::string s = text;
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  replace_all(s, ",", "");
  replace_all(s, "?", "");
  replace_all(s, "'s", " 's");
  s = trim(s);
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\t', ' ');
  return process_digit_article(process_punctuation(trim(s)));
}

AnswerScore score_answer(const std::string& answer, const std::string& reference) {
  const std::string a = normalize_vqa_answer(answer), r = normalize_vqa_answer(reference);
  AnswerScore s;
  s.exact = a == r;
  s.contains = !r.empty() && (" " + a + " ").find(" " + r + " ") != std::string::npos;
  return s;
}

double token_match_rate(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  const std::size_t n = std::max(a.size(), b.size());
  if (n == 0) return 1.0;
  std::size_t same = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(n);
}

std::vector<std::int32_t> answer_until_stop(const std::vector<std::int32_t>& ids,
                                            const std::vector<std::int32_t>& stop) {
  auto end = std::find_if(ids.begin(), ids.end(), [&](std::int32_t t) {
    return std::find(stop.begin(), stop.end(), t) != stop.end();
  });
  return {ids.begin(), end};
}

}  // namespace kvsim::live
