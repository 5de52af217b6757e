// Table-level kernels (table.hpp).
#include "table.hpp"

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "pool.hpp"

namespace psfleet {
namespace {

// Keys grouped by shard, stable: order[offsets[s] .. offsets[s + 1]) are the positions
// of shard s's keys, with their keys and hashes alongside. The buffers are the calling
// thread's, reused call after call: fresh ones would cost page faults and zeroing on
// every call, about as much as the lookups themselves.
struct Groups {
  std::vector<int64_t> offsets, order, at;
  std::vector<uint64_t> keys, hashes;
  std::vector<int32_t> shard;
};

template <class T>
void ensure(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

const Groups& group_by_shard(const ShardRule& rule, const uint64_t* keys, int64_t n) {
  thread_local Groups g;
  const int64_t s = rule.shards;
  g.offsets.assign(static_cast<size_t>(s + 1), 0);
  ensure(g.order, n);
  ensure(g.keys, n);
  ensure(g.hashes, n);
  if (s == 1) {  // one shard: the keys in their order
    for (int64_t i = 0; i < n; ++i) {
      g.order[i] = i;
      g.keys[i] = keys[i];
      g.hashes[i] = mix64(keys[i]);
    }
    g.offsets[1] = n;
    return g;
  }
  ensure(g.shard, n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = mix64(keys[i]);
    g.shard[i] = static_cast<int32_t>(rule.of(h));
    ++g.offsets[g.shard[i] + 1];
  }
  for (int64_t i = 0; i < s; ++i) g.offsets[i + 1] += g.offsets[i];
  g.at.assign(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t to = g.at[g.shard[i]]++;
    g.order[to] = i;
    g.keys[to] = keys[i];
    g.hashes[to] = mix64(keys[i]);
  }
  return g;
}

// Runs body(shard, begin, end, misses) for every shard that has keys, each under its
// mutex, on the pool; returns the concatenated misses, ascending.
//
// Each call starts at another shard (a rotating offset), so that calls running at the
// same time, which mostly touch every shard, do not queue behind each other on shard
// 0, then shard 1, ... but work on different shards side by side.
std::atomic<unsigned> g_rotation{0};

template <class Body>
std::vector<int64_t> per_shard(const std::vector<ShardState*>& shards, const Groups& g,
                               int threads, Body body) {
  std::vector<int> busy;
  const size_t count = g.offsets.size() - 1;
  // Consecutive calls start about half the table apart.
  const size_t start = (g_rotation.fetch_add(1) * (count / 2 + 1)) % count;
  for (size_t i = 0; i < count; ++i) {
    const size_t s = (start + i) % count;
    if (g.offsets[s + 1] > g.offsets[s]) busy.push_back(static_cast<int>(s));
  }
  std::vector<std::vector<int64_t>> misses(busy.size());
  run_tasks(static_cast<int>(busy.size()), threads, [&](int task) {
    const int s = busy[task];
    std::lock_guard<std::timed_mutex> lock(shards[s]->mu);
    body(*shards[s], g.offsets[s], g.offsets[s + 1], misses[task]);
  });
  std::vector<int64_t> out;
  for (auto& m : misses) out.insert(out.end(), m.begin(), m.end());
  std::sort(out.begin(), out.end());
  return out;
}

// Prefetches every cache line of p[0 .. count), which may straddle one more line
// than count * 4 / 64 (a row of 28 floats can touch 3).
inline void prefetch_floats(const float* p, int64_t count) {
  const auto begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const auto end = reinterpret_cast<uintptr_t>(p + count);
  for (uintptr_t line = begin; line < end; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line));
}

// dst[0 .. n) = src[0 .. n) inline: rows are short (dim 9: 36 bytes), where a call to
// memmove per row (what std::copy becomes) cost 16% of a pull (perf).
inline void copy_floats(float* dst, const float* src, int64_t n) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) __builtin_memcpy(dst + j, src + j, 16);
  for (; j < n; ++j) dst[j] = src[j];
}

}  // namespace

bool any_reserved(const uint64_t* keys, int64_t n) {
  bool found = false;
  for (int64_t i = 0; i < n; ++i) found |= keys[i] == ~uint64_t{0};
  return found;
}

bool has_duplicates(const uint64_t* keys, int64_t n) {
  if (n < 2) return false;
  int bits = 4;
  while ((int64_t{1} << bits) < 2 * n) ++bits;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  // Slots hold key + 1 (0: empty); the key 2^64 - 1 (+1 = 0) is tracked on its own.
  std::vector<uint64_t> set(static_cast<size_t>(mask + 1), 0);
  bool saw_top = false;
  constexpr int64_t kAhead = 16;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(set.data() + (mix64(keys[i + kAhead]) & mask));
    const uint64_t key = keys[i];
    if (key == ~uint64_t{0}) {
      if (saw_top) return true;
      saw_top = true;
      continue;
    }
    for (uint64_t s = mix64(key) & mask;; s = (s + 1) & mask) {
      if (set[s] == 0) {
        set[s] = key + 1;
        break;
      }
      if (set[s] == key + 1) return true;
    }
  }
  return false;
}

std::vector<int64_t> pull_rows(const std::vector<ShardState*>& shards, const ShardRule& rule,
                               const uint64_t* keys, int64_t n, float* out, int64_t width,
                               int threads) {
  const Groups& g = group_by_shard(rule, keys, n);
  return per_shard(shards, g, threads, [&](ShardState& st, int64_t begin, int64_t end,
                                           std::vector<int64_t>& miss) {
    if (st.data_width < width) throw std::runtime_error("row width below the pull's width");
    const float* data = st.data;
    const int64_t dw = st.data_width, rows = st.data_rows;
    probe_pipelined(
        st.index, end - begin, [&](int64_t i) { return g.keys[begin + i]; },
        [&](int64_t i) { return g.hashes[begin + i]; },
        [&](int64_t i, int64_t r) {
          if (r < rows) prefetch_floats(data + r * dw, width);
          (void)i;
        },
        [&](int64_t i, int64_t, int64_t r) {
          const int64_t at = g.order[begin + i];
          if (r < 0 || r >= rows) {
            miss.push_back(at);
            return;
          }
          copy_floats(out + at * width, data + r * dw, width);
        });
  });
}

std::vector<int64_t> update_rows(const std::vector<ShardState*>& shards, const ShardRule& rule,
                                 const uint64_t* keys, int64_t n, const float* values,
                                 const RuleParams& p, int threads) {
  const Groups& g = group_by_shard(rule, keys, n);
  const int64_t vw = p.value_width;
  return per_shard(shards, g, threads, [&](ShardState& st, int64_t begin, int64_t end,
                                           std::vector<int64_t>& miss) {
    if (st.data_width < row_width_needed(p) || st.data_width < p.dim)
      throw std::runtime_error("row width below the update's width");
    float* data = st.data;
    const int64_t dw = st.data_width, rows = st.data_rows;
    probe_pipelined(
        st.index, end - begin, [&](int64_t i) { return g.keys[begin + i]; },
        [&](int64_t i) { return g.hashes[begin + i]; },
        [&](int64_t, int64_t r) {
          if (r < rows) prefetch_floats(data + r * dw, dw);
        },
        [&](int64_t i, int64_t, int64_t r) {
          const int64_t at = g.order[begin + i];
          if (r < 0 || r >= rows || !update_row(p, data + r * dw, values + at * vw))
            miss.push_back(at);
        });
  });
}

}  // namespace psfleet
