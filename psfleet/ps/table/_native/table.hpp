// Table-level kernels: one call covers every internal shard of a table. Keys are
// grouped by shard (a counting sort), then each shard's group is a task of the pool,
// run under that shard's mutex (one mutex at a time, so no lock order can deadlock).
// Rows, keys and slots stay the numpy arrays of psfleet/ps/table/shard.py; ShardState
// borrows their buffers, rebound (under the mutex) whenever Python replaces one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "index.hpp"
#include "rules.hpp"

namespace psfleet {

struct ShardState {
  std::timed_mutex mu;
  IndexView index;
  float* data = nullptr;  // [data_rows, data_width], row-major
  int64_t data_rows = 0;
  int64_t data_width = 0;
};

// How a key picks its internal shard: ((mix64(key) >> shift) % buckets) % shards, the
// bucket step skipped when buckets is 0 (SparseTable._shard_rule gives the numbers).
struct ShardRule {
  int shift = 0;
  uint64_t buckets = 0;
  int64_t shards = 1;
  int64_t of(uint64_t hash) const {
    uint64_t h = hash >> shift;
    if (buckets) h %= buckets;
    return static_cast<int64_t>(h % static_cast<uint64_t>(shards));
  }
};

// Whether any of keys[0..n) is 2^64 - 1 (the reserved key).
bool any_reserved(const uint64_t* keys, int64_t n);

// Whether two of keys[0..n) are equal: one pass through an open-addressing set of
// 2-4n slots (linear probing on mix64), O(n), where numpy's check sorts the keys.
bool has_duplicates(const uint64_t* keys, int64_t n);

// out[i, :width] = the first width floats of the row of keys[i], for every key present;
// returns the positions of absent keys, ascending (out's rows there are untouched).
std::vector<int64_t> pull_rows(const std::vector<ShardState*>& shards, const ShardRule& rule,
                               const uint64_t* keys, int64_t n, float* out, int64_t width,
                               int threads);

// Applies p to the row of each of distinct keys[0..n) with values[i, :p.value_width];
// returns the positions not applied, ascending: absent keys and rows update_row left
// to the numpy rule.
std::vector<int64_t> update_rows(const std::vector<ShardState*>& shards, const ShardRule& rule,
                                 const uint64_t* keys, int64_t n, const float* values,
                                 const RuleParams& p, int threads);

}  // namespace psfleet
