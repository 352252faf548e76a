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

bool count_tensor(const at::Tensor& t0, Counts* c, Special* s, bool want_special) {
  at::Tensor t = t0;
  bool dense = t.is_non_overlapping_and_dense() && !t.is_neg() && !t.is_conj();
  if (dense) {
    for (auto st : t.strides()) {
      if (st < 0) dense = false;
    }
  }
  if (!dense) {
    at::DisableRecordFunctionGuard no_record;
    t = t.resolve_neg().contiguous();
  }
  int64_t n = t.numel();
  const void* data = t.const_data_ptr();
  if (n == 0) return true;
  if (data == nullptr) return false;
  auto run = [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      count_plain<T>(p, n, c);
    } else {
      count_widened<T>(p, n, c);
    }
    if (want_special && c->bad > 0) count_special<T>(p, n, s);
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

}  // namespace nanscope
