#include "sim/core/partial_files.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace kvsim {

namespace {

// Fixed storage, so the signal handler reads nothing the allocator owns.
constexpr int kSlots = 32;
constexpr std::size_t kPathMax = 4096;
char g_paths[kSlots][kPathMax];
std::atomic<bool> g_used[kSlots];

extern "C" void on_interrupt(int signal_number) {
  static const char kMessage[] = "\nkvsim: interrupted\n";
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  remove_tracked_partials();
  _exit(128 + signal_number);
}

}  // namespace

void track_partial(const std::string& partial_path) {
  if (partial_path.size() >= kPathMax) return;  // not tracked: the run still works
  for (int i = 0; i < kSlots; ++i) {
    if (g_used[i].load()) continue;
    std::memcpy(g_paths[i], partial_path.c_str(), partial_path.size() + 1);
    g_used[i].store(true);
    return;
  }
}

void untrack_partial(const std::string& partial_path) {
  for (int i = 0; i < kSlots; ++i)
    if (g_used[i].load() && partial_path == g_paths[i]) g_used[i].store(false);
}

void remove_tracked_partials() noexcept {
  for (int i = 0; i < kSlots; ++i)
    if (g_used[i].exchange(false)) unlink(g_paths[i]);
}

void remove_partials_on_interrupt() {
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
}

}  // namespace kvsim
