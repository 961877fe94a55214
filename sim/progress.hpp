// A progress bar on stderr for long runs: drawn only when stderr is a terminal and the work has
// taken more than a second, redrawn at most ten times a second, erased when done.
#pragma once

#include <chrono>
#include <string>

namespace kvsim {

class Progress {
 public:
  Progress(long total, std::string label);
  ~Progress();
  void advance(long n = 1);
  void finish();
  static bool stderr_is_terminal();

 private:
  void draw(bool force);
  long total_, done_ = 0;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool enabled_, drawn_ = false;
};

}  // namespace kvsim
