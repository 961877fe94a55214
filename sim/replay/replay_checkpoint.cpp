#include "sim/replay/replay_checkpoint.hpp"

#include <stdexcept>

namespace kvsim {

namespace {

ResumeStore open_store(const std::string& dir, const std::string& manifest) {
  ResumeStore store(dir, "checkpoint " + dir + ": cannot create the directory: ");
  if (const auto difference = store.claim("manifest.txt", manifest))
    throw std::runtime_error(
        "checkpoint " + dir + " holds finished samples of a different replay (" + *difference +
        "); rerun the command that made it, remove the directory, or give --checkpoint another "
        "directory");
  return store;
}

std::string key(int sample_index, const std::string& kind) {
  return "sample-" + std::to_string(sample_index) + "." + kind;
}

}  // namespace

ReplayCheckpoint::ReplayCheckpoint(const std::string& dir, const std::string& manifest)
    : store_(open_store(dir, manifest)) {}

std::string ReplayCheckpoint::file(int sample_index, const std::string& kind) const {
  return store_.path(key(sample_index, kind));
}

bool ReplayCheckpoint::finished(int sample_index) const {
  return store_.has(key(sample_index, "done"));
}

void ReplayCheckpoint::mark_finished(int sample_index, const std::string& state) const {
  store_.write(key(sample_index, "done"), state);
}

std::string ReplayCheckpoint::state(int sample_index) const {
  return store_.read(key(sample_index, "done"));
}

void ReplayCheckpoint::remove() const {
  store_.clear();
}

}  // namespace kvsim
