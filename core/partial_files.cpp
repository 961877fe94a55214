#include "core/partial_files.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>

namespace kvsim {

namespace {

// Fixed storage, so the signal handler reads nothing the allocator owns.
constexpr int kSlots = 32;
constexpr std::size_t kPathMax = 4096;
char g_paths[kSlots][kPathMax];
// Each slot is free, being written (claimed by one thread), or holding a tracked path: threads
// writing side by side (sweep items) track and untrack at the same time.
enum Slot : int { kFree = 0, kWriting = 1, kTracked = 2 };
std::atomic<int> g_slot[kSlots];
char g_note[kPathMax + 256];  // printed after "interrupted"; written before the work starts

extern "C" void on_interrupt(int signal_number) {
  static const char kMessage[] = "\nkvsim: interrupted\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  if (g_note[0] != 0) {
    n = write(STDERR_FILENO, "kvsim: ", 7);
    n = write(STDERR_FILENO, g_note, strlen(g_note));
    n = write(STDERR_FILENO, "\n", 1);
  }
  remove_tracked_partials();
  _exit(128 + signal_number);
}

}  // namespace

std::string partial(const std::string& path) {
  return path + ".partial";
}

std::string begin_partial(const std::string& path) {
  track_partial(partial(path));
  return partial(path);
}

std::FILE* open_partial(const std::string& path) {
  std::FILE* f = std::fopen(begin_partial(path).c_str(), "wb");
  if (!f) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
  return f;
}

void publish(const std::string& path) {
  if (std::rename(partial(path).c_str(), path.c_str()) != 0)
    throw std::runtime_error(path + ": cannot rename from " + partial(path) + ": " +
                             std::strerror(errno));
  untrack_partial(partial(path));
}

void discard_partial(const std::string& path) noexcept {
  std::remove(partial(path).c_str());
  untrack_partial(partial(path));
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  track_partial(tmp);  // an interrupted run leaves no temporary file
  const auto fail = [&](const std::string& why) {
    std::remove(tmp.c_str());
    untrack_partial(tmp);
    throw std::runtime_error(why);
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(tmp + ": cannot open for writing: " + std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written) fail(tmp + ": write failed (disk full?)");
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail(path + ": cannot rename from " + tmp + ": " + std::strerror(errno));
  untrack_partial(tmp);
}

void track_partial(const std::string& partial_path) {
  if (partial_path.size() >= kPathMax) return;  // not tracked: the run still works
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slot[i].compare_exchange_strong(expected, kWriting)) continue;
    std::memcpy(g_paths[i], partial_path.c_str(), partial_path.size() + 1);
    g_slot[i].store(kTracked);
    return;
  }
}

void untrack_partial(const std::string& partial_path) {
  for (int i = 0; i < kSlots; ++i) {
    int expected = kTracked;
    if (g_slot[i].load() == kTracked && partial_path == g_paths[i])
      g_slot[i].compare_exchange_strong(expected, kFree);
  }
}

void remove_tracked_partials() noexcept {
  for (int i = 0; i < kSlots; ++i)
    if (g_slot[i].exchange(kFree) == kTracked) unlink(g_paths[i]);
}

void set_interrupt_note(const std::string& note) {
  // The note is empty while the rest is written, so a signal meanwhile prints no half note.
  g_note[0] = 0;
  const std::size_t n = std::min(note.size(), sizeof g_note - 1);
  if (n == 0) return;
  std::memcpy(g_note + 1, note.data() + 1, n - 1);
  g_note[n] = 0;
  g_note[0] = note[0];
}

void remove_partials_on_interrupt() {
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
}

}  // namespace kvsim
