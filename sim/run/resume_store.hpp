// Finished work of a long run, kept in a directory so that the same command started again after
// an interruption redoes only what was not finished: one file per key, written whole (beside it,
// then renamed), so that a key's file exists only once complete. What a key stands for is the
// caller's: a replay's finished sample (its checkpoint), a sweep's (item, configuration) and the
// progress of a (trace, sample), a live run's sample.
#pragma once

#include <optional>
#include <string>

namespace kvsim {

class ResumeStore {
 public:
  // Opens `dir`, creating it (and its parents) when missing; throws std::runtime_error
  // `cannot_create` followed by the operating system's reason when that fails.
  ResumeStore(std::string dir, const std::string& cannot_create);
  const std::string& dir() const { return dir_; }
  // Where the key's file lives (for writers that publish it themselves, e.g. an HDF5 file).
  std::string path(const std::string& key) const;
  bool has(const std::string& key) const;
  // The key's text; throws std::runtime_error naming the file when it cannot be read.
  std::string read(const std::string& key) const;
  // The key's text, or std::nullopt when it is missing or unreadable.
  std::optional<std::string> try_read(const std::string& key) const;
  // Writes the key's file whole: readers, and a run started after an interruption, see it
  // complete or not at all.
  void write(const std::string& key, const std::string& text) const;
  // What every entry depends on, kept under `key`: written when the store has none; when it has
  // another, returns the first line where the two differ (the store belongs to another run).
  std::optional<std::string> claim(const std::string& key, const std::string& manifest) const;
  // Removes the key's file, if any (work made obsolete by what replaced it).
  void remove(const std::string& key) const;
  // Removes the directory and everything in it (once the run's outputs are published).
  void clear() const;

 private:
  std::string dir_;
};

}  // namespace kvsim
