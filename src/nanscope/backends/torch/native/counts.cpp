// The count kernel (see counts.h). The element loops are templates used only
// by count_tensor, here, so that they inline into it: the recorder calls
// count_tensor once per output tensor.
#include "counts.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace nanscope {
namespace {

// Comparisons summed as integers: no branches, so the loop vectorises; 32-bit
// sums over blocks fill twice the lanes of 64-bit ones. |x| <= max is false
// exactly for Inf and NaN.
template <typename T>
__attribute__((target_clones("avx2", "default"))) void count_plain(const T* p, int64_t n,
                                                                   Counts* c) {
  constexpr int64_t kBlock = 1 << 20;
  const T big = std::numeric_limits<T>::max();
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const T* q = p + start;
    int32_t neg = 0, zero = 0, bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      T x = q[i];
      neg += x < T(0);
      zero += x == T(0);
      bad += !(std::fabs(x) <= big);
    }
    c->neg += neg;
    c->zero += zero;
    c->bad += bad;
  }
}

template <typename H>
void count_widened(const H* p, int64_t n, Counts* c) {
  float buf[1024];
  for (int64_t i = 0; i < n; i += 1024) {
    int64_t m = std::min<int64_t>(1024, n - i);
    for (int64_t j = 0; j < m; ++j) buf[j] = static_cast<float>(p[i + j]);
    count_plain<float>(buf, m, c);
  }
}

template <typename T>
void count_special(const T* p, int64_t n, Special* s) {
  // Half types widen to float, doubles stay double (a narrowing would make
  // large finite values infinite).
  using W = std::conditional_t<std::is_same_v<T, double>, double, float>;
  for (int64_t i = 0; i < n; ++i) {
    W x = static_cast<W>(p[i]);
    if (std::isnan(x)) {
      ++s->nan;
    } else if (std::isinf(x)) {
      if (x > 0) {
        ++s->pinf;
      } else {
        ++s->ninf;
      }
    }
  }
}

}  // namespace

namespace {

constexpr int64_t kChunk = int64_t{1} << 22;  // elements copied at once from a layout we cannot walk

// Counts over a tensor whose memory it can walk directly.
bool count_dense(const at::Tensor& t, Counts* c, Special* s, bool want_special) {
  int64_t n = t.numel();
  if (n == 0) return true;
  const void* data = t.const_data_ptr();
  if (data == nullptr) return false;
  auto run = [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    Counts mine;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      count_plain<T>(p, n, &mine);
    } else {
      count_widened<T>(p, n, &mine);
    }
    if (want_special && mine.bad > 0) count_special<T>(p, n, s);
    c->neg += mine.neg;
    c->zero += mine.zero;
    c->bad += mine.bad;
  };
  switch (t.scalar_type()) {
    case at::kFloat: run(static_cast<const float*>(data)); break;
    case at::kDouble: run(static_cast<const double*>(data)); break;
    case at::kHalf: run(static_cast<const at::Half*>(data)); break;
    case at::kBFloat16: run(static_cast<const at::BFloat16*>(data)); break;
    default: return false;
  }
  return true;
}

bool walkable(const at::Tensor& t) {
  if (!t.is_non_overlapping_and_dense() || t.is_neg() || t.is_conj()) return false;
  for (auto st : t.strides()) {
    if (st < 0) return false;
  }
  return true;
}

// Counts over any layout, copying at most kChunk elements at a time: a view
// whose elements overlap (a sliding window) or run backwards is counted a
// slab of its first dimension at a time, never materialised whole.
bool count_any(const at::Tensor& t, Counts* c, Special* s, bool want_special) {
  if (walkable(t)) return count_dense(t, c, s, want_special);
  if (t.numel() <= kChunk || t.dim() == 0) {
    at::Tensor copy = t.resolve_neg().contiguous();
    return count_dense(copy, c, s, want_special);
  }
  if (t.size(0) == 1) return count_any(t.select(0, 0), c, s, want_special);
  const int64_t row = t.numel() / t.size(0);
  const int64_t step = std::max<int64_t>(1, kChunk / std::max<int64_t>(1, row));
  for (int64_t i = 0; i < t.size(0); i += step) {
    if (!count_any(t.narrow(0, i, std::min(step, t.size(0) - i)), c, s, want_special)) return false;
  }
  return true;
}

}  // namespace

bool count_tensor(const at::Tensor& t0, Counts* c, Special* s, bool want_special) {
  if (t0.numel() == 0) return true;
  if (walkable(t0)) return count_dense(t0, c, s, want_special);
  at::DisableRecordFunctionGuard no_record;
  // A broadcast (expand) repeats each element along its stride-0 dimensions:
  // count one copy and multiply, as a free view must stay free to summarise.
  at::Tensor t = t0;
  int64_t repeats = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.stride(d) == 0 && t.size(d) > 1) {
      repeats *= t.size(d);
      t = t.narrow(d, 0, 1);
    }
  }
  Counts once;
  Special special;
  if (!count_any(t, &once, &special, want_special)) return false;
  c->neg += once.neg * repeats;
  c->zero += once.zero * repeats;
  c->bad += once.bad * repeats;
  s->ninf += special.ninf * repeats;
  s->pinf += special.pinf * repeats;
  s->nan += special.nan * repeats;
  return true;
}

}  // namespace nanscope
