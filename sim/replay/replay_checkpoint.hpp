// The finished samples of a replay, kept in a directory so that rerunning an interrupted
// multi-sample replay resumes after the last finished sample instead of starting over.
#pragma once

#include <string>

#include "sim/run/resume_store.hpp"

namespace kvsim {

// DIR/manifest.txt records what a sample's results depend on (kvsim version, the trace's content
// hash, every policy's label and resolved parameters, the options and outputs asked for).
// Sample number i (its place in the trace) is finished once DIR/sample-i.done exists; its result
// files DIR/sample-i.<kind> are complete before that marker is written (a ResumeStore).
class ReplayCheckpoint {
 public:
  // Creates `dir` with `manifest`, or reopens it when it holds the same manifest. Throws
  // std::runtime_error naming the directory and the first line that differs when it belongs to
  // another replay.
  ReplayCheckpoint(const std::string& dir, const std::string& manifest);
  const std::string& dir() const { return store_.dir(); }
  std::string file(int sample_index, const std::string& kind) const;
  bool finished(int sample_index) const;
  // Marks a sample finished, keeping `state` (its summary, counters) with it; atomic.
  void mark_finished(int sample_index, const std::string& state) const;
  std::string state(int sample_index) const;
  // Removes the directory and everything in it (once the final outputs exist).
  void remove() const;

 private:
  ResumeStore store_;
};

}  // namespace kvsim
