// Result files are written to `<path>.partial` (or a temporary name unique to the writer) and
// renamed when complete: every file kvsim writes goes through here. The ones being written are
// tracked so that an interrupted or failed run removes them and leaves no half file behind.
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
// Removes partial(path) and stops tracking it: a write that failed.
void discard_partial(const std::string& path) noexcept;
// Writes `text` to `path` through a temporary file unique to this process and thread (writers side
// by side, and concurrent runs, each have their own) and a rename, so readers only ever see
// complete files; tracked meanwhile. Throws std::runtime_error naming the file.
void write_file_atomically(const std::string& path, const std::string& text);
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
