#include "sim/replay/replay_checkpoint.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "sim/replay/results.hpp"

namespace kvsim {

namespace fs = std::filesystem;

namespace {

// The first line where two manifests differ, for the error message.
std::string first_difference(const std::string& kept, const std::string& wanted) {
  std::istringstream a(kept), b(wanted);
  std::string la, lb;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) return "";
    if (!more_a) la = "(nothing)";
    if (!more_b) lb = "(nothing)";
    if (la != lb) return "it has '" + la + "' where this replay has '" + lb + "'";
  }
}

}  // namespace

ReplayCheckpoint::ReplayCheckpoint(std::string dir, const std::string& manifest)
    : dir_(std::move(dir)) {
  const std::string path = (fs::path(dir_) / "manifest.txt").string();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    const std::string kept = read_whole(path);
    if (kept != manifest)
      throw std::runtime_error(
          "checkpoint " + dir_ + " holds finished samples of a different replay (" +
          first_difference(kept, manifest) +
          "); rerun the command that made it, remove the directory, or give --checkpoint another "
          "directory");
    return;
  }
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw std::runtime_error("checkpoint " + dir_ + ": cannot create the directory: " +
                             (ec ? ec.message() : std::string("a file has that name")));
  write_whole(path, manifest);
}

std::string ReplayCheckpoint::file(int sample_index, const std::string& kind) const {
  return (fs::path(dir_) / ("sample-" + std::to_string(sample_index) + "." + kind)).string();
}

bool ReplayCheckpoint::finished(int sample_index) const {
  std::error_code ec;
  return fs::exists(file(sample_index, "done"), ec);
}

void ReplayCheckpoint::mark_finished(int sample_index, const std::string& state) const {
  write_whole(file(sample_index, "done"), state);
}

std::string ReplayCheckpoint::state(int sample_index) const {
  return read_whole(file(sample_index, "done"));
}

void ReplayCheckpoint::remove() const {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace kvsim
