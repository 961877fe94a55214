// Answer-level accuracy: generated text against a reference answer, normalised as lmms-eval
// normalises VQA answers, and a generated answer's agreement with the full cache's answer
// (EffiVLM-Bench's "loyalty": token match rate and the step of first divergence).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvsim::live {

// lmms-eval's EvalAIAnswerProcessor (lmms_eval/tasks/_task_utils/vqa_eval_metric.py), restated:
//  1. lower-case; drop ',' and '?'; "'s" -> " 's"; newlines and tabs -> spaces; trim;
//  2. each of ; / [ ] " { } ( ) = + \ _ - > < @ ` , ? ! is deleted when it touches a space in
//     the text or the text has a digit-comma-digit run, and otherwise becomes a space;
//  3. every '.' not followed by a digit is deleted;
//  4. words split on whitespace; number words zero..ten (and none) become digits; the articles
//     a, an, the are dropped; words rejoined with single spaces.
// Its table of apostrophe-less contractions ("dont" -> "don't") is not applied (docs/live.md).
std::string normalize_vqa_answer(const std::string& text);

struct AnswerScore {
  bool exact = false;     // normalised answer == normalised reference
  bool contains = false;  // the normalised reference occurs in the normalised answer as whole words
};
AnswerScore score_answer(const std::string& answer, const std::string& reference);

// The fraction of positions 0..n-1 where a[i] == b[i] (positions missing from either count as
// different); n = max(|a|, |b|). 1 for two empty answers.
double token_match_rate(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b);

// The answer a greedy run gave: `ids` up to, not including, the first stop token.
std::vector<std::int32_t> answer_until_stop(const std::vector<std::int32_t>& ids,
                                            const std::vector<std::int32_t>& stop);

}  // namespace kvsim::live
