// The retained KV entries of one layer, per KV head, as a policy sees and edits them.
//
// Entries are kept in position order (the engine appends each new token at the end and eviction
// preserves order), so "newer" always means "later index". Every eviction and merge is logged
// with the step it happened at (-1 = end of prefill) for --dump-decisions.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kvsim {

struct EvictionRecord {
  std::int32_t step;
  std::int32_t position;
};
struct MergeRecord {
  std::int32_t step;
  std::int32_t position;       // the entry that disappeared
  std::int32_t into_position;  // the entry that absorbed it
};

class KvCache {
 public:
  KvCache(int kv_heads, int head_dim);

  int kv_heads() const { return static_cast<int>(heads_.size()); }
  int head_dim() const { return d_; }
  int size(int g) const { return static_cast<int>(heads_[g].positions.size()); }
  // Entries that take part in attention (stored entries may be kept but not used).
  int attended_size(int g) const { return heads_[g].attended_count; }
  const std::vector<std::int32_t>& positions(int g) const { return heads_[g].positions; }
  std::int32_t position(int g, int e) const { return heads_[g].positions[e]; }
  bool attended(int g, int e) const { return heads_[g].attended[e] != 0; }
  // Key/value replacing the recorded ones after a merge, or nullptr for a recorded entry.
  const float* merged_key(int g, int e) const;
  const float* merged_value(int g, int e) const;
  bool has_merged(int g) const { return heads_[g].merged_count > 0; }

  // --- policy edits ---
  // Removes the listed entries (indices into the current order, any order, no duplicates).
  void evict(int g, std::span<const int> entries);
  // Keeps exactly the entries with keep[e] != 0.
  void keep_only(int g, const std::vector<std::uint8_t>& keep);
  // Evicts, from every KV head, the entries whose position satisfies `drop`.
  void evict_positions_if(const std::function<bool(std::int32_t)>& drop);
  void set_attended(int g, int e, bool attended);
  // Entry `from` disappears into entry `into`, which now holds key/value (d floats each).
  void merge(int g, int from, int into, const float* key, const float* value);

  // --- engine side ---
  void set_step(int step) { step_ = step; }
  int step() const { return step_; }
  void append(int g, std::int32_t position);
  void fill_prompt(int prompt_len);  // every head holds positions 0..P-1
  const std::vector<EvictionRecord>& evictions(int g) const { return heads_[g].evicted; }
  const std::vector<MergeRecord>& merges(int g) const { return heads_[g].merged; }
  // Checks ordering and uniqueness; throws std::logic_error naming the violation. The edits above
  // cannot break them (append refuses a position not newer than the last, removal keeps the
  // order), so the engine checks once per layer, not per step.
  void check_invariants(int g) const;

 private:
  struct Head {
    std::vector<std::int32_t> positions;
    std::vector<std::uint8_t> attended;
    int attended_count = 0;          // entries of `attended` that are 1
    std::vector<std::int32_t> slot;  // index into kv of a merged entry, -1 if recorded
    std::vector<float> kv;           // [slots, 2, d]
    int merged_count = 0;
    std::vector<EvictionRecord> evicted;
    std::vector<MergeRecord> merged;
  };
  // Removes the entries at `dropped` (ascending, unique, in range), logging them as evictions
  // when `log`; the others keep their order.
  void remove(int g, const std::vector<int>& dropped, bool log);
  std::vector<Head> heads_;
  int d_;
  int step_ = -1;
};

}  // namespace kvsim
