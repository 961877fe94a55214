// Structure-aware fuzzing: the fuzzer's bytes are read as a sequence of choices (which
// attribute to break, which shape, which type, which values), never handed to a parser as-is.
// Running out of bytes yields zeros, and every zero choice is the valid one, so an empty input
// builds a valid file and the fuzzer mutates away from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kvsim::fuzz {

class ByteSource {
 public:
  ByteSource(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A choice in [0, n).
  int pick(int n) { return n <= 1 ? 0 : byte() % n; }
  std::int64_t int64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return static_cast<std::int64_t>(v);
  }
  float float32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | byte();
    float f;
    std::memcpy(&f, &v, 4);
    return f;
  }
  std::string text(std::size_t max_len) {
    std::string s;
    const std::size_t n = byte() % (max_len + 1);
    for (std::size_t i = 0; i < n; ++i) s += static_cast<char>(byte());
    return s;
  }
  // The unread bytes, as a string.
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return s;
  }
  bool empty() const { return pos_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_, pos_ = 0;
};

}  // namespace kvsim::fuzz
