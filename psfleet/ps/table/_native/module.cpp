// psfleet.ps.table._core: the Python face of the native kernels (pybind11). Every
// array is checked here (dtype, dimensions, shape, C order, writeable) before native
// code touches it; a bad one raises ValueError naming the table and the argument.
// The kernels run with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>

#include "index.hpp"
#include "pool.hpp"
#include "table.hpp"

namespace py = pybind11;
using psfleet::ShardState;

namespace {

[[noreturn]] void bad(const std::string& label, const std::string& what) {
  throw py::value_error("table " + label + ": " + what);
}

template <class T>
void check(const py::array& a, const std::string& label, const char* name, int ndim,
           bool writeable) {
  if (!a.dtype().is(py::dtype::of<T>()))
    bad(label, std::string(name) + " must have dtype " +
                   std::string(py::str(py::dtype::of<T>())) + ", not " +
                   std::string(py::str(a.dtype())));
  if (a.ndim() != ndim)
    bad(label, std::string(name) + " must have " + std::to_string(ndim) + " dimension(s), not " +
                   std::to_string(a.ndim()));
  if (!(a.flags() & py::array::c_style)) bad(label, std::string(name) + " must be C-contiguous");
  if (writeable && !a.writeable()) bad(label, std::string(name) + " must be writeable");
}

// One shard's lock and the buffers of its numpy arrays (ShardState). Usable as the
// shard's ``lock`` from Python: acquire/release/locked and a context manager, blocking
// with the GIL released.
class ShardCore {
 public:
  ShardState state;
  py::object slots, row_keys, data;  // keep the borrowed buffers alive

  bool acquire(bool blocking, double timeout) {
    if (state.mu.try_lock()) return mark();
    if (!blocking) return false;
    bool got = false;
    {
      py::gil_scoped_release nogil;
      if (timeout < 0) {
        state.mu.lock();
        got = true;
      } else {
        got = state.mu.try_lock_for(std::chrono::duration<double>(timeout));
      }
    }
    return got ? mark() : false;
  }
  void release() {
    if (!held_) throw py::value_error("release of an unlocked shard lock");
    held_ = false;
    state.mu.unlock();
  }
  bool locked() const { return held_; }

  void bind_slots(const py::array& a) {
    check<int32_t>(a, "(shard)", "slots", 1, true);
    const int64_t n = a.shape(0);
    if (n < 16 || (n & (n - 1))) throw py::value_error("slots: size must be a power of two >= 16");
    int bits = 0;
    while ((int64_t{1} << bits) < n) ++bits;
    slots = a;
    state.index.slots = static_cast<int32_t*>(py::array(a).mutable_data());
    state.index.nslots = n;
    state.index.shift = 64 - bits;
  }
  void bind_row_keys(const py::array& a) {
    check<uint64_t>(a, "(shard)", "row_keys", 1, false);
    row_keys = a;
    state.index.row_keys = static_cast<const uint64_t*>(a.data());
    state.index.nrows = a.shape(0);
  }
  void bind_data(const py::array& a) {
    check<float>(a, "(shard)", "data", 2, true);
    data = a;
    state.data = static_cast<float*>(py::array(a).mutable_data());
    state.data_rows = a.shape(0);
    state.data_width = a.shape(1);
  }

 private:
  bool mark() {
    held_ = true;
    return true;
  }
  bool held_ = false;
};

std::vector<ShardState*> states(const py::list& cores) {
  std::vector<ShardState*> out;
  for (auto c : cores) out.push_back(&c.cast<ShardCore&>().state);
  return out;
}

psfleet::ShardRule shard_rule(const std::vector<ShardState*>& s, int shift, uint64_t buckets,
                              const std::string& label) {
  if (s.empty()) bad(label, "no shards");
  if (shift < 0 || shift > 63) bad(label, "shard_shift must be in 0..63");
  return psfleet::ShardRule{shift, buckets, static_cast<int64_t>(s.size())};
}

void check_keys(const py::array& keys, const std::string& label) {
  check<uint64_t>(keys, label, "keys", 1, false);
  const auto* k = static_cast<const uint64_t*>(keys.data());
  bool reserved;
  {
    py::gil_scoped_release nogil;
    reserved = psfleet::any_reserved(k, keys.shape(0));
  }
  if (reserved) bad(label, "key 2^64-1 is reserved");
}

py::array_t<int64_t> to_array(const std::vector<int64_t>& v) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

py::array_t<int64_t> table_pull(const py::list& cores, const py::array& keys, py::array out,
                                int shard_shift, uint64_t buckets, int threads,
                                const std::string& label) {
  auto s = states(cores);
  auto rule = shard_rule(s, shard_shift, buckets, label);
  check_keys(keys, label);
  check<float>(out, label, "out", 2, true);
  const int64_t n = keys.shape(0);
  if (out.shape(0) != n) bad(label, "out must have one row per key");
  const int64_t width = out.shape(1);
  const auto* k = static_cast<const uint64_t*>(keys.data());
  auto* o = static_cast<float*>(out.mutable_data());
  std::vector<int64_t> missing;
  {
    py::gil_scoped_release nogil;
    missing = psfleet::pull_rows(s, rule, k, n, o, width, threads);
  }
  return to_array(missing);
}

py::array_t<int64_t> table_update(const py::list& cores, const py::array& keys,
                                  const py::array& values, int op, int64_t dim, py::dict rule,
                                  const py::array& factors, bool factors_complete,
                                  int shard_shift, uint64_t buckets, int threads,
                                  const std::string& label) {
  auto s = states(cores);
  auto srule = shard_rule(s, shard_shift, buckets, label);
  check_keys(keys, label);
  check<float>(values, label, "values", 2, false);
  check<float>(factors, label, "factors", 2, false);
  const int64_t n = keys.shape(0);
  if (values.shape(0) != n) bad(label, "values must have one row per key");
  if (op < 0 || op > 5) bad(label, "unknown op " + std::to_string(op));
  if (dim <= 0) bad(label, "dim must be positive");
  psfleet::RuleParams p;
  p.op = static_cast<psfleet::Op>(op);
  p.dim = dim;
  p.value_width = values.shape(1);
  if (op <= 2 && p.value_width != dim) bad(label, "gradients must have dim columns");
  auto get = [&](const char* name) { return rule.contains(name) ? rule[name].cast<float>() : 0.f; };
  p.lr = get("lr");
  p.eps = get("eps");
  p.b1 = get("b1");
  p.b2 = get("b2");
  p.one_minus_b1 = get("one_minus_b1");
  p.one_minus_b2 = get("one_minus_b2");
  if (factors.shape(1) != 2) bad(label, "factors must have 2 columns");
  p.factors = static_cast<const float*>(factors.data());
  p.nfactors = factors.shape(0);
  p.factors_complete = factors_complete;
  const auto* k = static_cast<const uint64_t*>(keys.data());
  const auto* v = static_cast<const float*>(values.data());
  std::vector<int64_t> left;
  {
    py::gil_scoped_release nogil;
    left = psfleet::update_rows(s, srule, k, n, v, p, threads);
  }
  return to_array(left);
}

py::tuple probe(const py::array& slots, const py::array& row_keys, const py::array& keys,
                const py::array& hashes) {
  check<int32_t>(slots, "(index)", "slots", 1, false);
  check<uint64_t>(row_keys, "(index)", "row_keys", 1, false);
  check<uint64_t>(keys, "(index)", "keys", 1, false);
  check<uint64_t>(hashes, "(index)", "hashes", 1, false);
  const int64_t n = keys.shape(0), ns = slots.shape(0);
  if (hashes.shape(0) != n) throw py::value_error("hashes: one per key");
  if (ns < 16 || (ns & (ns - 1))) throw py::value_error("slots: size must be a power of two >= 16");
  int bits = 0;
  while ((int64_t{1} << bits) < ns) ++bits;
  psfleet::IndexView ix{const_cast<int32_t*>(static_cast<const int32_t*>(slots.data())), ns,
                        64 - bits, static_cast<const uint64_t*>(row_keys.data()),
                        row_keys.shape(0)};
  py::array_t<int64_t> slot_out(n), row_out(n);
  auto* so = slot_out.mutable_data();
  auto* ro = row_out.mutable_data();
  const auto* k = static_cast<const uint64_t*>(keys.data());
  const auto* h = static_cast<const uint64_t*>(hashes.data());
  {
    py::gil_scoped_release nogil;
    psfleet::probe_pipelined(
        ix, n, [&](int64_t i) { return k[i]; }, [&](int64_t i) { return h[i]; },
        [](int64_t, int64_t) {},
        [&](int64_t i, int64_t slot, int64_t row) {
          so[i] = slot;
          ro[i] = row;
        });
  }
  return py::make_tuple(slot_out, row_out);
}

bool has_duplicates(const py::array& keys) {
  check<uint64_t>(keys, "(merge)", "keys", 1, false);
  const auto* k = static_cast<const uint64_t*>(keys.data());
  const int64_t n = keys.shape(0);
  py::gil_scoped_release nogil;
  return psfleet::has_duplicates(k, n);
}

// out[index[i]] += values[i] for i = 0 .. N-1 in that order: the sums of equal keys'
// rows (merge.sum_equal_keys), bit for bit numpy's add.at (float32 adds in the order
// of the rows; -ffp-contract=off keeps them unfused).
void scatter_add(py::array out, const py::array& index, const py::array& values) {
  check<float>(out, "(merge)", "out", 2, true);
  check<int64_t>(index, "(merge)", "index", 1, false);
  check<float>(values, "(merge)", "values", 2, false);
  const int64_t n = index.shape(0), u = out.shape(0), d = out.shape(1);
  if (values.shape(0) != n || values.shape(1) != d)
    throw py::value_error("values: must be [len(index), out.shape[1]]");
  const auto* ix = static_cast<const int64_t*>(index.data());
  for (int64_t i = 0; i < n; ++i)
    if (ix[i] < 0 || ix[i] >= u) throw py::value_error("index: must be in 0 .. len(out)-1");
  auto* o = static_cast<float*>(out.mutable_data());
  const auto* v = static_cast<const float*>(values.data());
  py::gil_scoped_release nogil;
  for (int64_t i = 0; i < n; ++i) {
    float* row = o + ix[i] * d;
    const float* src = v + i * d;
    for (int64_t j = 0; j < d; ++j) row[j] += src[j];
  }
}

void place(py::array slots, const py::array& rows, const py::array& hashes) {
  check<int32_t>(slots, "(index)", "slots", 1, true);
  check<int64_t>(rows, "(index)", "rows", 1, false);
  check<uint64_t>(hashes, "(index)", "hashes", 1, false);
  const int64_t m = rows.shape(0), ns = slots.shape(0);
  if (hashes.shape(0) != m) throw py::value_error("hashes: one per row");
  if (ns < 16 || (ns & (ns - 1))) throw py::value_error("slots: size must be a power of two >= 16");
  const auto* r = static_cast<const int64_t*>(rows.data());
  for (int64_t i = 0; i < m; ++i)
    if (r[i] < 0 || r[i] > INT32_MAX) throw py::value_error("rows: must be in 0 .. 2^31-1");
  int bits = 0;
  while ((int64_t{1} << bits) < ns) ++bits;
  psfleet::IndexView ix{static_cast<int32_t*>(slots.mutable_data()), ns, 64 - bits, nullptr, 0};
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = psfleet::place_rows(ix, r, static_cast<const uint64_t*>(hashes.data()), m);
  }
  if (!ok) throw py::value_error("place: the index has no empty slot left");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "psfleet's native sparse-table kernels (psfleet/ps/table/_native)";
  py::class_<ShardCore>(m, "ShardCore")
      .def(py::init<>())
      .def("acquire", &ShardCore::acquire, py::arg("blocking") = true, py::arg("timeout") = -1.0)
      .def("release", &ShardCore::release)
      .def("locked", &ShardCore::locked)
      .def("__enter__", [](ShardCore& c) { return c.acquire(true, -1.0); })
      .def("__exit__", [](ShardCore& c, const py::args&) { c.release(); })
      .def("bind_slots", &ShardCore::bind_slots)
      .def("bind_row_keys", &ShardCore::bind_row_keys)
      .def("bind_data", &ShardCore::bind_data);
  m.def("table_pull", &table_pull);
  m.def("table_update", &table_update);
  m.def("probe", &probe);
  m.def("place", &place);
  m.def("has_duplicates", &has_duplicates);
  m.def("scatter_add", &scatter_add);
  m.def("set_threads", &psfleet::set_pool_threads);
  m.def("threads", &psfleet::pool_threads);
}
