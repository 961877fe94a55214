#include "sim/run/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace kvsim {

bool Progress::stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

Progress::Progress(long total, std::string label, double status_every)
    : total_(total),
      label_(std::move(label)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      enabled_(stderr_is_terminal()),
      status_every_(status_every),
      last_status_(start_) {}

Progress::~Progress() {
  finish();
}

void Progress::advance(long n) {
  done_ += n;
  draw(false);
}

void Progress::draw(bool force) {
  if (!enabled_) {
    const auto now = std::chrono::steady_clock::now();
    if (status_every_ <= 0 ||
        std::chrono::duration<double>(now - last_status_).count() < status_every_)
      return;
    last_status_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = done_ / std::max(elapsed, 1e-9);
    std::fprintf(stderr, "%s: %ld/%ld done, %.2f/s, ETA %.0f s\n", label_.c_str(), done_, total_,
                 rate, rate > 0 ? (total_ - done_) / rate : 0.0);
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (!force && (elapsed < 1.0 || now - last_draw_ < std::chrono::milliseconds(100))) return;
  last_draw_ = now;
  const double frac = total_ > 0 ? static_cast<double>(done_) / total_ : 1.0;
  const int width = 30, filled = static_cast<int>(frac * width);
  const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  std::fprintf(stderr, "\r%s [%.*s%*s] %ld/%ld  %.1fs, ETA %.1fs ", label_.c_str(), filled,
               "##############################", width - filled, "", done_, total_, elapsed, eta);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
  enabled_ = false;
}

}  // namespace kvsim
