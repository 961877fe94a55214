#include "sim/live/pieces.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "core/splitmix.hpp"

namespace kvsim::live {

namespace fs = std::filesystem;

std::string fingerprint_of(const std::vector<std::string>& parts) {
  std::uint64_t h = kStoreKeyOffset;
  for (const auto& p : parts) h = fnv1a64(p + "\n", h);
  return hex16(h);
}

std::string checkpoint_fingerprint(const std::string& dir) {
  std::vector<std::string> parts;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const auto mtime = e.last_write_time().time_since_epoch().count();
    parts.push_back(e.path().filename().string() + " " + std::to_string(e.file_size()) + " " +
                    std::to_string(mtime));
  }
  std::sort(parts.begin(), parts.end());
  return fingerprint_of(parts);
}

PieceStore::PieceStore(const std::string& output, const std::string& fingerprint)
    : store_(output + ".parts",
             output + ".parts: cannot create the directory of finished samples: "),
      fingerprint_(fingerprint) {}

std::string PieceStore::key(std::size_t index, const std::string& sample) const {
  return std::to_string(index) + "-" + fingerprint_of({fingerprint_, sample});
}

std::string PieceStore::path(std::size_t index, const std::string& sample) const {
  return store_.path(key(index, sample));
}

bool PieceStore::done(std::size_t index, const std::string& sample) const {
  return store_.has(key(index, sample));
}

}  // namespace kvsim::live
