#pragma once
// The count kernel: how many elements of a CPU float tensor are negative,
// zero, and Inf or NaN (and of those, how many are -Inf, +Inf and NaN).
// The recorder turns these counts into an output's summary row (see
// summarize in recorder.cpp). Kept apart from recording because it is
// numeric code with its own concerns: loops that vectorise, a build per
// instruction set, half types widened to float.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>

namespace nanscope {

struct Counts {
  int64_t neg = 0, zero = 0, bad = 0;  // bad: Inf or NaN
  // With ranges asked for: the largest finite |x| and the smallest non-zero
  // finite |x| (nanscope.format.headroom); 0 and +inf when there is none.
  double hi = 0, lo = std::numeric_limits<double>::infinity();
};

struct Special {
  int64_t ninf = 0, pinf = 0, nan = 0;
};

// Counts over the elements of a CPU float tensor, in memory order; `s` only
// when `want_special` and some element is Inf or NaN; `c->hi` and `c->lo`
// only when `want_ranges`. False for a dtype it does not count (float,
// double, half and bfloat16 only) or a tensor without data.
bool count_tensor(const at::Tensor& t0, Counts* c, Special* s, bool want_special,
                  bool want_ranges = false);

// The statistics of a CPU float tensor (nanscope.format.statistics): the mean,
// the population standard deviation and the L2 norm of its finite elements (NaN
// when there is none), and the order-free hash of every element's bits (the sum
// modulo 2**64 of splitmix64 of each element's bits, zero-extended, kept to its
// low 52 bits), the same numbers as format.statistics.statistics_of. False for a
// dtype it does not know (float, double, half and bfloat16) or a tensor without data.
struct Statistics {
  double mean = 0, std = 0, l2 = 0, hash = 0;
};
bool tensor_statistics(const at::Tensor& t, Statistics* out);

// Whether a CPU float tensor holds Inf or NaN, for check_numerics: one pass
// over the values' bits (half types as they are, without widening), a max
// reduction that vectorises; -1 for a dtype it does not know or a tensor
// without data. Any layout (a non-dense one is counted by count_tensor).
int any_nonfinite(const at::Tensor& t);

}  // namespace nanscope
