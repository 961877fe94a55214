// Answer-level accuracy of the live path: the VQA answer normalisation, answer scoring and
// loyalty worked out by hand, and decoding through both vocabulary formats.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "sim/live/answers.hpp"
#include "sim/live/checkpoint.hpp"
#include "sim/live/vocabulary.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

using live::normalize_vqa_answer;

TEST(VqaNormalisation, WorkedExamples) {
  // lower-case, the final period goes, the article goes
  EXPECT_EQ(normalize_vqa_answer("The Dress."), "dress");
  EXPECT_EQ(normalize_vqa_answer(" shirt. He"), "shirt he");
  // commas go first; '!' touches no space, so it becomes one; number words become digits
  EXPECT_EQ(normalize_vqa_answer("Two cats, one dog!"), "2 cats 1 dog");
  // a period before a digit stays
  EXPECT_EQ(normalize_vqa_answer("3.5 kg"), "3.5 kg");
  // '-' touching a space is deleted; elsewhere in that text too
  EXPECT_EQ(normalize_vqa_answer("yes - well-known"), "yes wellknown");
  // '-' touching no space becomes a space
  EXPECT_EQ(normalize_vqa_answer("well-known"), "well known");
  EXPECT_EQ(normalize_vqa_answer("Lily's hat"), "lily 's hat");
  EXPECT_EQ(normalize_vqa_answer("1,000 dollars"), "1000 dollars");
  EXPECT_EQ(normalize_vqa_answer("an apple\tand\na pear"), "apple and pear");
  EXPECT_EQ(normalize_vqa_answer("none"), "0");
  EXPECT_EQ(normalize_vqa_answer("  "), "");
}

TEST(VqaScore, ExactAndContains) {
  auto s = live::score_answer("Lily saw the dress.", "dress");
  EXPECT_FALSE(s.exact);
  EXPECT_TRUE(s.contains);
  s = live::score_answer(" dress.\n", "Dress");
  EXPECT_TRUE(s.exact);
  EXPECT_TRUE(s.contains);
  s = live::score_answer("dressy", "dress");  // whole words only
  EXPECT_FALSE(s.exact);
  EXPECT_FALSE(s.contains);
  s = live::score_answer("a red dress", "red dress");
  EXPECT_TRUE(s.exact);
  s = live::score_answer("the red dress and a hat", "red dress");
  EXPECT_TRUE(s.contains);
  s = live::score_answer("anything", "");  // an empty reference is never contained
  EXPECT_FALSE(s.contains);
}

TEST(Loyalty, TokenMatchRateAndAnswerUntilStop) {
  EXPECT_DOUBLE_EQ(live::token_match_rate({1, 2, 3}, {1, 5, 3, 4}), 0.5);  // 2 of 4 positions
  EXPECT_DOUBLE_EQ(live::token_match_rate({7}, {7}), 1.0);
  EXPECT_DOUBLE_EQ(live::token_match_rate({}, {}), 1.0);
  EXPECT_DOUBLE_EQ(live::token_match_rate({}, {3}), 0.0);
  EXPECT_EQ(live::answer_until_stop({5, 6, 2, 7}, {1, 2}), (std::vector<std::int32_t>{5, 6}));
  EXPECT_EQ(live::answer_until_stop({5, 6}, {1, 2}), (std::vector<std::int32_t>{5, 6}));
  EXPECT_EQ(live::answer_until_stop({5, 6}, {}), (std::vector<std::int32_t>{5, 6}));
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(dir);
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(Vocabulary, Llama2cDecodesPiecesBytesAndDropsTheSpaceAfterTheStartToken) {
  const std::string dir = temp_path("vocab_llama2c");
  write_file(dir, "vocab.json",
             R"({"pieces": ["<unk>", "\n<s>\n", "\n</s>\n", "<0x41>", " Lily", " saw", "."],
                 "scores": [0, 0, 0, 0, 0, 0, 0], "bos_id": 1, "eos_id": 2})");
  const auto v = live::Vocabulary::find(dir);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->decode({1, 4, 5, 3, 6, 2}), "Lily sawA.");  // BOS and EOS add no text
  EXPECT_EQ(v->decode({5, 6}), " saw.");                  // not after BOS: the space stays
  EXPECT_EQ(v->decode({99}), "");                         // unknown ids add nothing
}

TEST(Vocabulary, TokenizerJsonByteLevelAndSentencePiece) {
  const std::string gpt = temp_path("vocab_bytelevel");
  // GPT-2's byte-to-unicode map: space is U+0120 (Ġ), newline U+010A (Ċ).
  write_file(gpt, "tokenizer.json",
             R"({"model": {"type": "BPE", "vocab": {"\u0120dress": 0, ".": 1, "\u010a": 2, "a": 3}},
                 "added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": true}],
                 "decoder": {"type": "ByteLevel"}})");
  // a transformers vocab.json (piece -> id) beside it is not a llama2.c vocabulary
  write_file(gpt, "vocab.json", R"({"a": 3})");
  auto v = live::Vocabulary::find(gpt);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->decode({0, 1, 2, 3, 4}), " dress.\na");

  const std::string sp = temp_path("vocab_sentencepiece");
  write_file(sp, "tokenizer.json",
             R"({"model": {"type": "BPE", "vocab": {"\u2581The": 0, "\u2581dress": 1, "<0x21>": 2}},
                 "decoder": {"type": "Sequence", "decoders": [
                   {"type": "Replace"}, {"type": "ByteFallback"}, {"type": "Fuse"},
                   {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}})");
  v = live::Vocabulary::find(sp);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->decode({0, 1, 2}), "The dress!");
}

TEST(Vocabulary, AbsentOrMalformed) {
  EXPECT_FALSE(live::Vocabulary::find(temp_path("vocab_none")).has_value());
  const std::string bad = write_file(temp_path("vocab_bad"), "tokenizer.json", R"({"model": {}})");
  try {
    live::Vocabulary::load(bad);
    FAIL() << "a tokenizer.json without model.vocab was accepted";
  } catch (const live::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvsim::test
