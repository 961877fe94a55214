// Result files are written to `<path>.partial` and renamed when complete. The ones being written
// are tracked so that an interrupted or failed run removes them and leaves no half file behind.
#pragma once

#include <cstdio>
#include <string>

namespace kvsim {

// `<path>.partial`, where the file `path` is written until it is complete.
std::string partial(const std::string& path);
// partial(path), tracked from now until publish(path): the name to open for writing.
std::string begin_partial(const std::string& path);
// Opens begin_partial(path) for writing ("wb"); throws std::runtime_error naming the user's
// path and the operating system's reason.
std::FILE* open_partial(const std::string& path);
// Renames partial(path) to `path` and stops tracking it; throws std::runtime_error naming both.
void publish(const std::string& path);
// Starts / stops tracking a file being written (the .partial path itself).
void track_partial(const std::string& partial_path);
void untrack_partial(const std::string& partial_path);
// Removes every tracked file. Async-signal-safe (unlink only): callable from a SIGINT handler.
void remove_tracked_partials() noexcept;
// A line printed after "interrupted" (e.g. where finished work is kept); "" for none.
void set_interrupt_note(const std::string& note);
// Installs SIGINT and SIGTERM handlers that say "interrupted", remove the tracked files and exit
// with 128 + the signal number.
void remove_partials_on_interrupt();

}  // namespace kvsim
