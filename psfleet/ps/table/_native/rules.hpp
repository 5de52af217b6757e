// Row updates of psfleet/ps/table/rules.py, one row at a time, in float32 with the
// operations in numpy's order (the build passes -ffp-contract=off, so no multiply-add
// is fused): the same bits as the numpy reference. Adam's bias corrections are the one
// float64 part; numpy computes beta ** t with its own (SIMD) pow, which differs from
// libm's, so they come from a table that numpy computed (RuleParams::factors).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace psfleet {

enum class Op : int { kSgd = 0, kAdagrad = 1, kAdam = 2, kAdd = 3, kAssign = 4, kSet = 5 };

struct RuleParams {
  Op op = Op::kSgd;
  int64_t dim = 0;
  int64_t value_width = 0;  // floats per row of the pushed values
  float lr = 0, eps = 0, b1 = 0, b2 = 0;
  float one_minus_b1 = 0, one_minus_b2 = 0;  // float(1 - np.float32(beta)), as rules.py
  // Adam: factors[2 (t - 1)] = float32(lr / (1 - beta1^t)),
  // factors[2 (t - 1) + 1] = float32(1 / sqrt(1 - beta2^t)), t = 1 .. nfactors.
  const float* factors = nullptr;
  int64_t nfactors = 0;
  bool factors_complete = false;  // both are constant past nfactors
};

// Floats a row needs for the op: its values and the state the op reads.
inline int64_t row_width_needed(const RuleParams& p) {
  switch (p.op) {
    case Op::kAdagrad: return 2 * p.dim;
    case Op::kAdam: return 3 * p.dim + 1;
    case Op::kSgd: return p.dim;
    default: return p.value_width;
  }
}

// Applies the op to one row of ``p.dim`` values + state, in place. Returns false, the
// row untouched, where the float32 kernel cannot reproduce numpy exactly (an Adam step
// count that is not a whole number within the factor table): the caller then leaves
// that row to the numpy rule.
inline bool update_row(const RuleParams& p, float* row, const float* g) {
  const int64_t d = p.dim;
  float* w = row;
  switch (p.op) {
    case Op::kSgd:
      for (int64_t j = 0; j < d; ++j) w[j] = w[j] - p.lr * g[j];
      return true;
    case Op::kAdagrad: {
      float* acc = row + d;
      for (int64_t j = 0; j < d; ++j) {
        acc[j] = acc[j] + g[j] * g[j];
        w[j] = w[j] - (p.lr * g[j]) / (std::sqrt(acc[j]) + p.eps);
      }
      return true;
    }
    case Op::kAdam: {
      float* m = row + d;
      float* v = row + 2 * d;
      float& t = row[3 * d];
      const float steps = t + 1.0f;
      if (!(steps >= 1.0f) || steps != std::floor(steps)) return false;
      int64_t at = static_cast<int64_t>(steps);
      if (at > p.nfactors) {
        if (!p.factors_complete || p.nfactors == 0) return false;
        at = p.nfactors;
      }
      const float step_size = p.factors[2 * (at - 1)];
      const float inv_sqrt_bc2 = p.factors[2 * (at - 1) + 1];
      for (int64_t j = 0; j < d; ++j) {
        m[j] = m[j] * p.b1;
        m[j] = m[j] + p.one_minus_b1 * g[j];
        v[j] = v[j] * p.b2;
        v[j] = v[j] + (p.one_minus_b2 * g[j]) * g[j];
      }
      t = steps;
      for (int64_t j = 0; j < d; ++j)
        w[j] = w[j] - (step_size * m[j]) / (std::sqrt(v[j]) * inv_sqrt_bc2 + p.eps);
      return true;
    }
    case Op::kAdd:
      for (int64_t j = 0; j < p.value_width; ++j) row[j] = row[j] + g[j];
      return true;
    case Op::kAssign:
    case Op::kSet:
      for (int64_t j = 0; j < p.value_width; ++j) row[j] = g[j];
      return true;
  }
  return false;
}

}  // namespace psfleet
