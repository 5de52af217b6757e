// HashIndex._place's rounds (index.hpp).
#include "index.hpp"

namespace psfleet {

bool place_rows(const IndexView& ix, const int64_t* rows, const uint64_t* hashes,
                int64_t m) {
  constexpr int64_t kWindow = 8;
  const int64_t mask = ix.nslots - 1;
  std::vector<int64_t> pending(static_cast<size_t>(m)), pos(static_cast<size_t>(m));
  std::vector<int64_t> chosen(static_cast<size_t>(m));
  std::vector<int64_t> rounds(static_cast<size_t>(m), 0);  // windows swept per row
  for (int64_t i = 0; i < m; ++i) {
    pending[i] = i;
    pos[i] = static_cast<int64_t>(hashes[i] >> ix.shift) & mask;
  }
  int64_t count = m;
  while (count > 0) {
    // Reads first: a window's emptiness as at the start of the round.
    for (int64_t i = 0; i < count; ++i) {
      if (i + 8 < count) __builtin_prefetch(ix.slots + pos[i + 8]);
      chosen[i] = -1;
      for (int64_t w = 0; w < kWindow; ++w) {
        const int64_t s = (pos[i] + w) & mask;
        if (ix.slots[s] < 0) {
          chosen[i] = s;
          break;
        }
      }
    }
    // Claims: the last row naming a slot keeps it.
    for (int64_t i = 0; i < count; ++i)
      if (chosen[i] >= 0) ix.slots[chosen[i]] = static_cast<int32_t>(-2 - i);
    int64_t left = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t c = chosen[i];
      if (c >= 0 && ix.slots[c] == static_cast<int32_t>(-2 - i)) {
        ix.slots[c] = static_cast<int32_t>(rows[pending[i]]);
        continue;
      }
      const int64_t p = pending[i];
      if (c < 0 && ++rounds[p] * kWindow > ix.nslots) return false;  // no empty slot
      pending[left] = p;
      pos[left] = (c >= 0 ? c + 1 : pos[i] + kWindow) & mask;
      ++left;
    }
    count = left;
  }
  return true;
}

}  // namespace psfleet
