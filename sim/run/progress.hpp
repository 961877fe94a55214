// A progress bar on stderr for long runs: drawn only when stderr is a terminal and the work has
// taken more than a second, redrawn at most ten times a second, erased when done.
#pragma once

#include <chrono>
#include <string>

namespace kvsim {

class Progress {
 public:
  // status_every > 0: when stderr is not a terminal, print a one-line status that often (seconds).
  Progress(long total, std::string label, double status_every = 0);
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
  double status_every_;
  std::chrono::steady_clock::time_point last_status_;
};

}  // namespace kvsim
