// The count kernel (see counts.h). The element loops are templates used only
// by count_tensor, here, so that they inline into it: the recorder calls
// count_tensor once per output tensor.
#include "counts.h"


#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

namespace nanscope {
namespace {

// Comparisons summed as integers: no branches, so the loop vectorises; 32-bit
// sums over blocks fill twice the lanes of 64-bit ones. |x| <= max is false
// exactly for Inf and NaN.
template <typename T>
__attribute__((target_clones("avx2", "default"))) void count_values(const T* p, int64_t n,
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

// The same counts, and the largest finite |x| and the smallest non-zero one,
// in one pass over the values' bits: for non-negative IEEE values the bit
// patterns order as integers do, and integer reductions vectorise where
// floating-point max/min do not (NaN and signed zeros forbid reordering them
// without -ffast-math). Both extremes are max reductions (GCC 12 vectorises a
// max beside a min of these selects in no form tried): the smallest non-zero
// |x| is kMax minus the largest of kMax - (|x| - 1), where |x| - 1 wraps a
// zero (or a non-finite value, taken as 0) to the sign bit, masked off.
template <typename T>
__attribute__((target_clones("avx2", "default"))) void count_ranged(const T* p, int64_t n,
                                                                    Counts* c) {
  using S = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  using U = std::make_unsigned_t<S>;
  constexpr int kSign = sizeof(T) * 8 - 1;
  constexpr S kMax = std::numeric_limits<S>::max();  // also the mask of |x|'s bits
  constexpr S kInf = sizeof(T) == 4 ? S(0x7f800000) : S(0x7ff0000000000000ll);
  constexpr int64_t kBlock = 1 << 20;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const T* q = p + start;
    S neg = 0, zero = 0, bad = 0, hi = 0, rlo = 0;
    for (int64_t i = 0; i < m; ++i) {
      U b;
      std::memcpy(&b, q + i, sizeof(T));
      S a = static_cast<S>(b & static_cast<U>(kMax));  // |x|'s bits
      S fin = a < kInf ? a : S(0);
      hi = std::max(hi, fin);
      rlo = std::max(rlo, S(kMax - ((fin - 1) & kMax)));
      neg += static_cast<S>(b >> kSign) & S(a != 0) & S(a <= kInf);  // x < 0, -Inf too
      zero += S(a == 0);
      bad += S(a >= kInf);
    }
    c->neg += neg;
    c->zero += zero;
    c->bad += bad;
    T h;
    std::memcpy(&h, &hi, sizeof(T));
    c->hi = std::max(c->hi, static_cast<double>(h));
    const S lo = kMax - rlo;
    if (lo != kMax) {
      const S bits = lo + 1;
      T l;
      std::memcpy(&l, &bits, sizeof(T));
      c->lo = std::min(c->lo, static_cast<double>(l));
    }
  }
}

// A block's extremes, from the intrinsic loops' lanes: the largest finite |x|'s bits, and the
// smallest non-zero |x|'s bits less one (all ones: there was none).
void add_extremes(int32_t hi_bits, uint32_t lo_bits_less_one, Counts* c) {
  float hf;
  std::memcpy(&hf, &hi_bits, sizeof hf);
  c->hi = std::max(c->hi, static_cast<double>(hf));
  if (lo_bits_less_one != 0xffffffffu) {
    const uint32_t bits = lo_bits_less_one + 1;
    float lf;
    std::memcpy(&lf, &bits, sizeof lf);
    c->lo = std::min(c->lo, static_cast<double>(lf));
  }
}

// count_ranged for float on AVX-512: the same counts and extremes, 16 values a step,
// written with intrinsics. The comparisons are mask registers that the counts add
// under, and the smallest non-zero |x| is an unsigned min of |x| - 1 (a zero wraps
// to the largest value and drops out), so a step is about a dozen instructions where
// count_ranged's AVX2 loop, as GCC builds it, needs about twenty for 8 values. The
// FULL_HEALTH count of an optimizer's update of a large weight is most of a small
// model's recording cost (bench/HISTORY.md, "Issue 34").
__attribute__((target("avx512f"))) void count_ranged_f32_avx512(const float* p, int64_t n,
                                                                Counts* c) {
  constexpr int64_t kBlock = 1 << 20;  // each lane's 32-bit counts stay below 2**16
  const __m512i kMaxV = _mm512_set1_epi32(0x7fffffff);  // the mask of |x|'s bits
  const __m512i kInfV = _mm512_set1_epi32(0x7f800000);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i zero = _mm512_setzero_si512();
  const int64_t whole = n & ~int64_t(15);
  int64_t i = 0;
  while (i < whole) {
    const int64_t end = std::min(whole, i + kBlock);
    __m512i hi = zero, lo1 = _mm512_set1_epi32(-1), neg = zero, zer = zero, bad = zero;
    for (; i < end; i += 16) {
      const __m512i b = _mm512_loadu_si512(p + i);
      const __m512i a = _mm512_and_si512(b, kMaxV);
      const __mmask16 m_bad = _mm512_cmpge_epi32_mask(a, kInfV);
      const __mmask16 m_nan = _mm512_cmpgt_epi32_mask(a, kInfV);
      const __mmask16 m_zero = _mm512_cmpeq_epi32_mask(a, zero);
      const __m512i fin = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~m_bad), a);
      hi = _mm512_max_epi32(hi, fin);
      lo1 = _mm512_min_epu32(lo1, _mm512_sub_epi32(fin, one));
      // x < 0: the sign bit of a value neither zero nor NaN (-Inf counts).
      const __mmask16 m_neg =
          _mm512_mask_cmplt_epi32_mask(static_cast<__mmask16>(~(m_zero | m_nan)), b, zero);
      neg = _mm512_mask_add_epi32(neg, m_neg, neg, one);
      zer = _mm512_mask_add_epi32(zer, m_zero, zer, one);
      bad = _mm512_mask_add_epi32(bad, m_bad, bad, one);
    }
    c->neg += _mm512_reduce_add_epi32(neg);
    c->zero += _mm512_reduce_add_epi32(zer);
    c->bad += _mm512_reduce_add_epi32(bad);
    add_extremes(_mm512_reduce_max_epi32(hi), _mm512_reduce_min_epu32(lo1), c);
  }
  if (i < n) count_ranged<float>(p + i, n - i, c);  // the last few values
}

// The same on AVX2, 8 values a step: a comparison gives lanes of all ones (-1), which
// the counts subtract.
__attribute__((target("avx2"))) void count_ranged_f32_avx2(const float* p, int64_t n, Counts* c) {
  constexpr int64_t kBlock = 1 << 20;
  const __m256i kMaxV = _mm256_set1_epi32(0x7fffffff);
  const __m256i kInfV = _mm256_set1_epi32(0x7f800000);
  const __m256i kBelowInf = _mm256_set1_epi32(0x7f800000 - 1);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i zero = _mm256_setzero_si256();
  const int64_t whole = n & ~int64_t(7);
  int64_t i = 0;
  while (i < whole) {
    const int64_t end = std::min(whole, i + kBlock);
    __m256i hi = zero, lo1 = _mm256_set1_epi32(-1), neg = zero, zer = zero, bad = zero;
    for (; i < end; i += 8) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
      const __m256i a = _mm256_and_si256(b, kMaxV);
      const __m256i m_bad = _mm256_cmpgt_epi32(a, kBelowInf);
      const __m256i m_nan = _mm256_cmpgt_epi32(a, kInfV);
      const __m256i m_zero = _mm256_cmpeq_epi32(a, zero);
      const __m256i fin = _mm256_andnot_si256(m_bad, a);
      hi = _mm256_max_epi32(hi, fin);
      lo1 = _mm256_min_epu32(lo1, _mm256_sub_epi32(fin, one));
      const __m256i sign = _mm256_srai_epi32(b, 31);
      neg = _mm256_sub_epi32(neg, _mm256_andnot_si256(_mm256_or_si256(m_zero, m_nan), sign));
      zer = _mm256_sub_epi32(zer, m_zero);
      bad = _mm256_sub_epi32(bad, m_bad);
    }
    alignas(32) int32_t lanes[5][8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), neg);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), zer);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), bad);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[3]), hi);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[4]), lo1);
    int32_t h = 0;
    uint32_t l1 = 0xffffffffu;
    for (int k = 0; k < 8; ++k) {
      c->neg += lanes[0][k];
      c->zero += lanes[1][k];
      c->bad += lanes[2][k];
      h = std::max(h, lanes[3][k]);
      l1 = std::min(l1, static_cast<uint32_t>(lanes[4][k]));
    }
    add_extremes(h, l1, c);
  }
  if (i < n) count_ranged<float>(p + i, n - i, c);
}

// Which float32 loop counts: the widest this CPU has, or NANSCOPE_COUNT_ISA's choice
// ("avx512", "avx2", "portable": GCC's loops), so that tests run each on one machine.
enum class Isa { kPortable, kAvx2, kAvx512 };
Isa choose_isa() {
  const char* want = std::getenv("NANSCOPE_COUNT_ISA");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2");
  if (want != nullptr && *want != '\0' && std::strcmp(want, "auto") != 0) {
    if (std::strcmp(want, "avx512") == 0 && avx512) return Isa::kAvx512;
    if (std::strcmp(want, "avx2") == 0 && avx2) return Isa::kAvx2;
    return Isa::kPortable;
  }
  return avx512 ? Isa::kAvx512 : (avx2 ? Isa::kAvx2 : Isa::kPortable);
}

Isa isa() {
  static const Isa chosen = choose_isa();
  return chosen;
}

template <typename T, bool kRanges>
void count_plain(const T* p, int64_t n, Counts* c) {
  if constexpr (kRanges) {
    if constexpr (std::is_same_v<T, float>) {
      if (n >= 64) {  // shorter runs: GCC's loop, as before
        switch (isa()) {
          case Isa::kAvx512: return count_ranged_f32_avx512(p, n, c);
          case Isa::kAvx2: return count_ranged_f32_avx2(p, n, c);
          case Isa::kPortable: break;
        }
      }
    }
    count_ranged<T>(p, n, c);
  } else {
    count_values<T>(p, n, c);
  }
}

template <typename H, bool kRanges>
void count_widened(const H* p, int64_t n, Counts* c) {
  float buf[1024];
  for (int64_t i = 0; i < n; i += 1024) {
    int64_t m = std::min<int64_t>(1024, n - i);
    for (int64_t j = 0; j < m; ++j) buf[j] = static_cast<float>(p[i + j]);
    count_plain<float, kRanges>(buf, m, c);
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

// Counts over n elements `stride` apart; a strided run is gathered into a
// small buffer first, so the count loops stay the vectorised ones.
template <typename T, bool kRanges>
void count_run(const T* p, int64_t n, int64_t stride, Counts* c, Special* s, bool want_special) {
  auto count = [&](const T* q, int64_t m) {
    Counts mine;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      count_plain<T, kRanges>(q, m, &mine);
    } else {
      count_widened<T, kRanges>(q, m, &mine);
    }
    if (want_special && mine.bad > 0) count_special<T>(q, m, s);
    c->neg += mine.neg;
    c->zero += mine.zero;
    c->bad += mine.bad;
    c->hi = std::max(c->hi, mine.hi);
    c->lo = std::min(c->lo, mine.lo);
  };
  if (stride == 1) {
    count(p, n);
    return;
  }
  T buf[1024];
  for (int64_t i = 0; i < n; i += 1024) {
    int64_t m = std::min<int64_t>(1024, n - i);
    for (int64_t j = 0; j < m; ++j) buf[j] = p[(i + j) * stride];
    count(buf, m);
  }
}

struct Dim {
  int64_t size, stride;
};

// Walks a strided layout in place: any view (transposed, sliced, a sliding window
// whose elements overlap) is visited element by element as it appears, as runs of
// `run(p, n, stride)` along its innermost dimension; a dense layout in any order is
// one run. Nothing is copied or dispatched (an op run here would be seen by the
// program's own dispatch modes).
template <typename T, typename Run>
void walk_layout(const T* base, c10::SmallVector<Dim, 8> dims, Run run) {
  // Innermost (smallest stride) last.
  std::sort(dims.begin(), dims.end(),
            [](const Dim& x, const Dim& y) { return x.stride > y.stride; });
  int64_t expected = 1;
  bool dense = true;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    dense = dense && it->stride == expected;
    expected *= it->size;
  }
  if (dims.empty() || dense) {
    run(base, expected, int64_t{1});
    return;
  }
  const Dim inner = dims.back();
  dims.pop_back();
  c10::SmallVector<int64_t, 8> at(dims.size(), 0);
  const T* p = base;
  while (true) {
    run(p, inner.size, inner.stride);
    int64_t d = static_cast<int64_t>(dims.size()) - 1;
    for (; d >= 0; --d) {  // the odometer: next position of the outer dimensions
      if (++at[d] < dims[d].size) {
        p += dims[d].stride;
        break;
      }
      p -= dims[d].stride * (dims[d].size - 1);
      at[d] = 0;
    }
    if (d < 0) return;
  }
}

// Counts over a strided layout, walked in place (walk_layout).
template <typename T, bool kRanges>
void count_walk(const T* base, const c10::SmallVector<Dim, 8>& dims, Counts* c, Special* s,
                bool want_special) {
  walk_layout<T>(base, dims, [&](const T* p, int64_t n, int64_t stride) {
    count_run<T, kRanges>(p, n, stride, c, s, want_special);
  });
}

template <bool kRanges>
bool count_typed(const at::Tensor& t, Counts* c, Special* s, bool want_special) {
  const int64_t n = t.numel();
  if (n == 0) return true;
  const void* data = t.const_data_ptr();
  if (data == nullptr) return false;
  // A broadcast (expand) repeats each element along its stride-0 dimensions:
  // count one copy and multiply, so a free view stays free to summarise.
  int64_t repeats = 1;
  c10::SmallVector<Dim, 8> dims;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.size(d), stride = t.stride(d);
    if (size == 1) continue;
    if (stride == 0) {
      repeats *= size;
    } else if (stride < 0) {
      return false;  // PyTorch makes none; not worth a path
    } else {
      dims.push_back({size, stride});
    }
  }
  Counts once;
  Special special;
  switch (t.scalar_type()) {
    case at::kFloat: count_walk<float, kRanges>(static_cast<const float*>(data), dims, &once, &special, want_special); break;
    case at::kDouble: count_walk<double, kRanges>(static_cast<const double*>(data), dims, &once, &special, want_special); break;
    case at::kHalf: count_walk<at::Half, kRanges>(static_cast<const at::Half*>(data), dims, &once, &special, want_special); break;
    case at::kBFloat16: count_walk<at::BFloat16, kRanges>(static_cast<const at::BFloat16*>(data), dims, &once, &special, want_special); break;
    default: return false;
  }
  if (t.is_neg()) {
    // The values are the memory's negated: negatives and positives trade
    // places, and so do -Inf and +Inf (without the special counts, only
    // whether any element is Inf/NaN is asked, which negation keeps).
    const int64_t distinct = n / repeats;
    once.neg = distinct - once.neg - once.zero - special.nan;
    std::swap(special.ninf, special.pinf);
  }
  c->neg += once.neg * repeats;
  c->zero += once.zero * repeats;
  c->bad += once.bad * repeats;
  s->ninf += special.ninf * repeats;
  s->pinf += special.pinf * repeats;
  s->nan += special.nan * repeats;
  c->hi = std::max(c->hi, once.hi);  // |x| is the same for a negated view and each repeat
  c->lo = std::min(c->lo, once.lo);
  return true;
}

}  // namespace

namespace {

// The largest |x| bit pattern of n values whose bits are U; Inf and NaN are
// exactly the patterns at or above the exponent mask (kInf).
template <typename U>
__attribute__((target_clones("avx2", "default"))) U max_magnitude(const U* p, int64_t n) {
  constexpr U kAbs = static_cast<U>(~(U(1) << (sizeof(U) * 8 - 1)));
  U m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max<U>(m, static_cast<U>(p[i] & kAbs));
  return m;
}

}  // namespace

int any_nonfinite(const at::Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return 0;
  if (!t.is_non_overlapping_and_dense()) {
    Counts c;
    Special s;
    if (!count_tensor(t, &c, &s, false)) return -1;
    return c.bad > 0 ? 1 : 0;
  }
  const void* data = t.const_data_ptr();
  if (data == nullptr) return -1;
  switch (t.scalar_type()) {
    case at::kFloat:
      return max_magnitude(static_cast<const uint32_t*>(data), n) >= 0x7f800000u;
    case at::kDouble:
      return max_magnitude(static_cast<const uint64_t*>(data), n) >= 0x7ff0000000000000ull;
    case at::kHalf:
      return max_magnitude(static_cast<const uint16_t*>(data), n) >= 0x7c00u;
    case at::kBFloat16:
      return max_magnitude(static_cast<const uint16_t*>(data), n) >= 0x7f80u;
    default:
      return -1;
  }
}

namespace {

// -- statistics (see counts.h) ----------------------------------------------------------------

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Finite elements' count, mean and sum of squared deviations, combined part by part
// with Chan's formula (the deviation keeps its precision when the mean is large),
// and the hash's sum (wrapping).
struct StatAcc {
  double n = 0, mean = 0, m2 = 0;
  uint64_t hash = 0;
  void combine(double n2, double mean2, double m22) {
    if (n2 == 0) return;
    const double total = n + n2, delta = mean2 - mean;
    mean += delta * n2 / total;
    m2 += m22 + delta * delta * n * n2 / total;
    n = total;
  }
};

// The hash's sum over n elements' bits (U: their unsigned type), each XORed with
// `flip` first (a negated view's sign bit).
template <typename U>
__attribute__((target_clones("avx2", "default"))) uint64_t hash_bits(const U* p, int64_t n,
                                                                  U flip) {
  uint64_t h = 0;
  for (int64_t i = 0; i < n; ++i) h += splitmix64(static_cast<uint64_t>(static_cast<U>(p[i] ^ flip)));
  return h;
}

// A small block's finite statistics, in two passes over it while it is in cache.
// W: the type the values are read as (float or double); `sign`: -1 for a negated view.
// Branch-free, so that the loops vectorise: a non-finite value's bits are zeroed into
// a copy, with a weight of 0, and the sums run in kLanes independent lanes (the
// additions of one lane stay in order: no -ffast-math needed).
template <typename W>
__attribute__((target_clones("avx2", "default"))) void block_statistics(const W* q, int64_t m,
                                                                        double sign,
                                                                        StatAcc* acc) {
  using B = std::conditional_t<sizeof(W) == 4, uint32_t, uint64_t>;
  constexpr B kAbs = static_cast<B>(~(B(1) << (sizeof(W) * 8 - 1)));
  constexpr B kInf = sizeof(W) == 4 ? B(0x7f800000u) : B(0x7ff0000000000000ull);
  constexpr int kLanes = 8;
  W vals[1024];
  W weight[1024];
  for (int64_t i = 0; i < m; ++i) {
    B b;
    std::memcpy(&b, q + i, sizeof(W));
    const B keep = static_cast<B>(0) - static_cast<B>((b & kAbs) < kInf);
    const B x = b & keep;
    std::memcpy(&vals[i], &x, sizeof(W));
    weight[i] = static_cast<W>(keep & 1u);
  }
  double sum[kLanes] = {}, count[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= m; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      sum[k] += static_cast<double>(vals[i + k]);
      count[k] += static_cast<double>(weight[i + k]);
    }
  }
  double s = 0, c = 0;
  for (int k = 0; k < kLanes; ++k) s += sum[k], c += count[k];
  for (int64_t j = i; j < m; ++j) s += static_cast<double>(vals[j]), c += static_cast<double>(weight[j]);
  if (c == 0) return;
  const double mean = s / c;
  double m2[kLanes] = {};
  for (i = 0; i + kLanes <= m; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double d = (static_cast<double>(vals[i + k]) - mean) * static_cast<double>(weight[i + k]);
      m2[k] += d * d;
    }
  }
  double dev = 0;
  for (int k = 0; k < kLanes; ++k) dev += m2[k];
  for (int64_t j = i; j < m; ++j) {
    const double d = (static_cast<double>(vals[j]) - mean) * static_cast<double>(weight[j]);
    dev += d * d;
  }
  acc->combine(c, sign * mean, dev);
}

template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, uint16_t,
                                std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;

// The statistics of n contiguous elements, in blocks.
template <typename T>
void statistics_run(const T* p, int64_t n, bool negated, StatAcc* acc) {
  using U = Bits<T>;
  const U flip = negated ? static_cast<U>(U(1) << (sizeof(T) * 8 - 1)) : U(0);
  const double sign = negated ? -1.0 : 1.0;
  constexpr int64_t kBlock = 1024;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min<int64_t>(kBlock, n - i);
    // Block by block, so that the moments read what the hash just brought into cache:
    // one pass over memory.
    acc->hash += hash_bits<U>(reinterpret_cast<const U*>(p + i), m, flip);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      block_statistics<T>(p + i, m, sign, acc);
    } else {
      float buf[kBlock];
      for (int64_t j = 0; j < m; ++j) buf[j] = static_cast<float>(p[i + j]);
      block_statistics<float>(buf, m, sign, acc);
    }
  }
}

// The statistics over a strided layout, walked in place (walk_layout; a strided run
// gathered into a small buffer first).
template <typename T>
void statistics_walk(const T* base, const c10::SmallVector<Dim, 8>& dims, bool negated,
                     StatAcc* acc) {
  walk_layout<T>(base, dims, [&](const T* p, int64_t n, int64_t stride) {
    if (stride == 1) {
      statistics_run<T>(p, n, negated, acc);
      return;
    }
    T buf[1024];
    for (int64_t i = 0; i < n; i += 1024) {
      const int64_t m = std::min<int64_t>(1024, n - i);
      for (int64_t j = 0; j < m; ++j) buf[j] = p[(i + j) * stride];
      statistics_run<T>(buf, m, negated, acc);
    }
  });
}

}  // namespace

bool tensor_statistics(const at::Tensor& t, Statistics* out) {
  StatAcc acc;
  int64_t repeats = 1;
  if (t.numel() > 0) {
    const void* data = t.const_data_ptr();
    if (data == nullptr) return false;
    // A broadcast repeats each element along its stride-0 dimensions: one copy, scaled.
    c10::SmallVector<Dim, 8> dims;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t size = t.size(d), stride = t.stride(d);
      if (size == 1) continue;
      if (stride == 0) {
        repeats *= size;
      } else if (stride < 0) {
        return false;
      } else {
        dims.push_back({size, stride});
      }
    }
    const bool neg = t.is_neg();
    switch (t.scalar_type()) {
      case at::kFloat: statistics_walk<float>(static_cast<const float*>(data), dims, neg, &acc); break;
      case at::kDouble: statistics_walk<double>(static_cast<const double*>(data), dims, neg, &acc); break;
      case at::kHalf: statistics_walk<at::Half>(static_cast<const at::Half*>(data), dims, neg, &acc); break;
      case at::kBFloat16: statistics_walk<at::BFloat16>(static_cast<const at::BFloat16*>(data), dims, neg, &acc); break;
      default: return false;
    }
  } else {
    switch (t.scalar_type()) {
      case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: break;
      default: return false;
    }
  }
  const uint64_t hashed = (acc.hash * static_cast<uint64_t>(repeats)) & ((uint64_t(1) << 52) - 1);
  out->hash = static_cast<double>(hashed);
  if (acc.n == 0) {
    out->mean = out->std = out->l2 = std::nan("");
    return true;
  }
  const double n = acc.n * static_cast<double>(repeats), m2 = acc.m2 * static_cast<double>(repeats);
  out->mean = acc.mean;
  out->std = std::sqrt(m2 / n);
  out->l2 = std::sqrt(m2 + n * acc.mean * acc.mean);
  return true;
}

bool count_tensor(const at::Tensor& t, Counts* c, Special* s, bool want_special, bool want_ranges) {
  return want_ranges ? count_typed<true>(t, c, s, want_special)
                     : count_typed<false>(t, c, s, want_special);
}

}  // namespace nanscope
