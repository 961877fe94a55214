#include "sim/live/vocabulary.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/live/checkpoint.hpp"

namespace kvsim::live {

namespace {

using json = nlohmann::json;

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(path + ": cannot open (does it exist?)");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw CheckpointError(path + ": not valid JSON: " + e.what());
  }
}

// GPT-2's bytes_to_unicode, inverted: the code point a ByteLevel piece uses for each byte.
// Printable Latin-1 bytes (! .. ~, ¡ .. ¬, ® .. ÿ) stand for themselves; the other 68 bytes take
// the code points 256, 257, ... in byte order.
std::unordered_map<std::uint32_t, unsigned char> byte_level_decoder() {
  std::unordered_map<std::uint32_t, unsigned char> out;
  std::uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    out[printable ? static_cast<std::uint32_t>(b) : next++] = static_cast<unsigned char>(b);
  }
  return out;
}

// The code points of a UTF-8 string (pieces are valid UTF-8 in both formats).
std::vector<std::uint32_t> code_points(const std::string& s) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    std::uint32_t cp = n == 1 ? c : c & (0xff >> (n + 1));
    for (int k = 1; k < n && i + k < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

// "<0xNN>" -> the byte NN, else -1.
int byte_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  try {
    return std::stoi(p.substr(3, 2), nullptr, 16);
  } catch (const std::exception&) {
    return -1;
  }
}

bool decoder_has(const json& decoder, const std::string& type) {
  if (!decoder.is_object()) return false;
  if (decoder.value("type", "") == type) return true;
  if (decoder.contains("decoders") && decoder["decoders"].is_array())
    for (const auto& d : decoder["decoders"])
      if (decoder_has(d, type)) return true;
  return false;
}

}  // namespace

Vocabulary Vocabulary::load(const std::string& path) {
  const json j = read_json_file(path);
  Vocabulary v;
  v.path_ = path;
  if (j.contains("pieces") && j["pieces"].is_array()) {  // llama2.c
    v.kind_ = Kind::kLlama2c;
    for (std::size_t i = 0; i < j["pieces"].size(); ++i) {
      if (!j["pieces"][i].is_string())
        throw CheckpointError(path + ": pieces[" + std::to_string(i) + "] is not a string");
      v.pieces_[static_cast<std::int32_t>(i)] = j["pieces"][i].get<std::string>();
    }
    for (const char* key : {"bos_id", "eos_id"}) {
      if (!j.contains(key) || !j[key].is_number_integer())
        throw CheckpointError(path + ": llama2.c vocabulary without an integer '" + key + "'");
      v.special_.insert(j[key].get<std::int32_t>());
    }
    v.bos_ = j["bos_id"].get<std::int32_t>();
    return v;
  }
  if (!j.contains("model") || !j["model"].contains("vocab") || !j["model"]["vocab"].is_object())
    throw CheckpointError(path + ": neither a llama2.c vocabulary (\"pieces\") nor a tokenizer.json "
                                 "with model.vocab");
  for (const auto& [piece, id] : j["model"]["vocab"].items()) {
    if (!id.is_number_integer())
      throw CheckpointError(path + ": model.vocab['" + piece + "'] is not an integer id");
    v.pieces_[id.get<std::int32_t>()] = piece;
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"]) {
      if (!t.contains("id") || !t["id"].is_number_integer() || !t.contains("content"))
        throw CheckpointError(path + ": an added_tokens entry lacks an integer id or content");
      const auto id = t["id"].get<std::int32_t>();
      v.pieces_[id] = t["content"].get<std::string>();
      if (t.value("special", false)) v.special_.insert(id);
    }
  const json decoder = j.contains("decoder") ? j["decoder"] : json();
  v.kind_ = decoder_has(decoder, "ByteLevel") ? Kind::kByteLevel : Kind::kSentencePiece;
  v.strip_leading_space_ = decoder_has(decoder, "Strip");
  return v;
}

std::optional<Vocabulary> Vocabulary::find(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path llama2c = fs::path(dir) / "vocab.json", hf = fs::path(dir) / "tokenizer.json";
  if (fs::exists(llama2c)) {
    const json j = read_json_file(llama2c.string());
    if (j.contains("pieces")) return load(llama2c.string());  // else a GPT-2 style vocab.json
  }
  if (fs::exists(hf)) return load(hf.string());
  return std::nullopt;
}

std::string Vocabulary::decode(const std::vector<std::int32_t>& ids) const {
  static const auto bytes_of = byte_level_decoder();
  std::string out;
  std::int32_t prev = -1;
  for (const std::int32_t id : ids) {
    const auto it = pieces_.find(id);
    if (it == pieces_.end() || special_.count(id)) {
      prev = id;
      continue;  // unknown ids and special tokens add no text
    }
    std::string piece = it->second;
    if (kind_ == Kind::kByteLevel) {
      for (const std::uint32_t cp : code_points(piece)) {
        const auto b = bytes_of.find(cp);
        if (b != bytes_of.end()) out += static_cast<char>(b->second);
      }
    } else if (const int b = byte_piece(piece); b >= 0) {
      out += static_cast<char>(b);
    } else {
      if (kind_ == Kind::kSentencePiece)
        for (std::size_t at = piece.find("\u2581"); at != std::string::npos;
             at = piece.find("\u2581", at + 1))
          piece.replace(at, 3, " ");
      // llama2.c's run.c drops the leading space of the piece after BOS.
      if (kind_ == Kind::kLlama2c && prev == bos_ && !piece.empty() && piece[0] == ' ')
        piece.erase(0, 1);
      out += piece;
    }
    prev = id;
  }
  if (strip_leading_space_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace kvsim::live
