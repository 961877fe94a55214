// Finished per-sample pieces of a long live run (`kvsim live capture` / `evaluate`), kept in
// `<output>.parts/` until the whole output is published. A run interrupted by Ctrl-C, SIGKILL or a
// CUDA error and started again with the same arguments reuses every finished piece, and since an
// uninterrupted run also assembles its output from its pieces, both write the same bytes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "sim/run/resume_store.hpp"

namespace kvsim::live {

class PieceStore {
 public:
  // `fingerprint`: everything a piece depends on (kvsim's version, the checkpoint, the prompt
  // file, the options); pieces of another fingerprint are never reused.
  PieceStore(const std::string& output, const std::string& fingerprint);
  // Where sample number `index` (named `sample`) lives; it exists only once complete.
  std::string path(std::size_t index, const std::string& sample) const;
  bool done(std::size_t index, const std::string& sample) const;
  // Removes the directory, once the output that assembles the pieces is published.
  void clear() const { store_.clear(); }
  const std::string& dir() const { return store_.dir(); }

 private:
  // A sample's key: its index and a hash of the fingerprint and its name (sample names are any
  // string, so the name itself never names a file).
  std::string key(std::size_t index, const std::string& sample) const;
  ResumeStore store_;
  std::string fingerprint_;
};

// A cheap identity of a checkpoint directory: each file's name, size and modification time.
std::string checkpoint_fingerprint(const std::string& dir);

// FNV-1a of the parts, joined by newlines, in hex.
std::string fingerprint_of(const std::vector<std::string>& parts);

}  // namespace kvsim::live
