#include "sim/run/resume_store.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "core/partial_files.hpp"
#include "sim/run/result_files.hpp"

namespace kvsim {

namespace fs = std::filesystem;

namespace {

// The first line where two manifests differ, for the caller's error message.
std::string first_difference(const std::string& kept, const std::string& wanted) {
  std::istringstream a(kept), b(wanted);
  std::string la, lb;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) return "";
    if (!more_a) la = "(nothing)";
    if (!more_b) lb = "(nothing)";
    if (la != lb) return "it has '" + la + "' where this run has '" + lb + "'";
  }
}

}  // namespace

ResumeStore::ResumeStore(std::string dir, const std::string& cannot_create) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw std::runtime_error(cannot_create +
                             (ec ? ec.message() : std::string("a file has that name")));
}

std::string ResumeStore::path(const std::string& key) const {
  return (fs::path(dir_) / key).string();
}

bool ResumeStore::has(const std::string& key) const {
  std::error_code ec;
  return fs::exists(path(key), ec);
}

std::string ResumeStore::read(const std::string& key) const {
  return read_whole(path(key));
}

std::optional<std::string> ResumeStore::try_read(const std::string& key) const {
  std::ifstream in(path(key), std::ios::binary);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void ResumeStore::write(const std::string& key, const std::string& text) const {
  write_file_atomically(path(key), text);
}

std::optional<std::string> ResumeStore::claim(const std::string& key,
                                              const std::string& manifest) const {
  if (!has(key)) {
    write(key, manifest);
    return std::nullopt;
  }
  const std::string kept = read(key);
  if (kept == manifest) return std::nullopt;
  return first_difference(kept, manifest);
}

void ResumeStore::remove(const std::string& key) const {
  std::error_code ignored;
  fs::remove(path(key), ignored);
}

void ResumeStore::clear() const {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace kvsim
