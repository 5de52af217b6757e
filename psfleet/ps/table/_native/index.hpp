// The hash index's kernels over the numpy arrays of psfleet.ps.table.hash_index.HashIndex:
// ``slots`` int32[2^bits] (row number, -1 empty), ``row_keys`` uint64[rows].
// A key's home slot is mix64(key) >> (64 - bits); probing is linear (the module
// docstring of hash_index.py). Everything here is plain C++ (no Python), so it can run
// with the GIL released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace psfleet {

// SplitMix64's finaliser (Steele, Lea & Flood, OOPSLA 2014), as psfleet.ps.hashing.mix64.
inline uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return z;
}

// A hash index's arrays, borrowed (never owned).
struct IndexView {
  int32_t* slots = nullptr;
  int64_t nslots = 0;  // a power of two
  int shift = 60;      // 64 - bits
  const uint64_t* row_keys = nullptr;
  int64_t nrows = 0;   // entries of row_keys
};

// Probes keys 0..n-1 for their slot and row, software-pipelined: the home slot of key
// i + kSlotAhead is prefetched while key i + kRowAhead's slot is read (its row's key
// and ``prefetch_row(i, row)`` prefetched) and key i is resolved, so the three dependent
// cache misses of a lookup (slot, row key, row data) overlap across keys. The issue
// measured that this staging, not the C++ loop itself, is what beats numpy (2.4-3.2x
// against 1.1-1.8x for one key at a time).
//
// ``visit(i, slot, row)`` gets slot = row = -1 for an absent key. A row number past
// ``nrows`` (a corrupt index) reads as absent, and a probe stops after ``nslots`` steps,
// so no input makes this read out of bounds or loop forever.
template <class KeyAt, class HashAt, class PrefetchRow, class Visit>
void probe_pipelined(const IndexView& ix, int64_t n, KeyAt key_at, HashAt hash_at,
                     PrefetchRow prefetch_row, Visit visit) {
  // Distances in keys; 8/16 measured as good as 16/24, 16/32 and 24/32 (1M rows, dim 9).
  constexpr int64_t kRing = 32, kRowAhead = 8, kSlotAhead = 16;
  int64_t home[kRing];
  int32_t first[kRing];
  const int64_t mask = ix.nslots - 1;
  if (ix.nslots <= 0) {
    for (int64_t i = 0; i < n; ++i) visit(i, int64_t{-1}, int64_t{-1});
    return;
  }
  for (int64_t i = 0; i < n + kSlotAhead; ++i) {
    if (i < n) {
      const int64_t p = static_cast<int64_t>(hash_at(i) >> ix.shift) & mask;
      home[i & (kRing - 1)] = p;
      __builtin_prefetch(ix.slots + p);
    }
    const int64_t j = i - (kSlotAhead - kRowAhead);
    if (j >= 0 && j < n) {
      const int32_t r = ix.slots[home[j & (kRing - 1)]];
      first[j & (kRing - 1)] = r;
      if (r >= 0 && r < ix.nrows) {
        __builtin_prefetch(ix.row_keys + r);
        prefetch_row(j, static_cast<int64_t>(r));
      }
    }
    const int64_t k = i - kSlotAhead;
    if (k < 0) continue;
    int64_t p = home[k & (kRing - 1)];
    int64_t r = first[k & (kRing - 1)];
    const uint64_t key = key_at(k);
    for (int64_t step = 0;; ++step) {
      if (r < 0 || r >= ix.nrows || step >= ix.nslots) {
        visit(k, int64_t{-1}, int64_t{-1});
        break;
      }
      if (ix.row_keys[r] == key) {
        visit(k, p, r);
        break;
      }
      p = (p + 1) & mask;
      r = ix.slots[p];
    }
  }
}

// HashIndex._place of hash_index.py, round for round: each pending row takes the first
// empty slot in the 8-slot window at its position (emptiness as at the round's start);
// rows naming the same slot leave it to the last of them (numpy's fancy assignment),
// the others go on after it, rows whose window was full go on 8 slots later. The same
// rounds give the same slot layout as the numpy reference, hence the same order of
// freed rows on later removals. Returns false (slots unchanged past what was placed)
// only if a row found no empty slot in a whole sweep of the array (a full index).
bool place_rows(const IndexView& ix, const int64_t* rows, const uint64_t* hashes,
                int64_t m);

}  // namespace psfleet
