// nanscope_graph::counts: one tensor's summary counts, as an op that compiled
// graphs call (nanscope.backends.torch.compiled.rewrite adds one call per
// instrumented CPU value of a torch.compile graph).
//
// Counting inside the graph with ATen reductions (five sums per value, fused
// by inductor into the producing loops) makes each count a buffer of its own:
// inductor's scheduler and C++ compiler work on five more kernels' worth of
// code per value (the first compile took about 3x as long), and each call of
// the graph creates an alias tensor per count in the generated Python
// wrapper (about 1,000 per step of a small Transformer). This op is one
// extern kernel call per value instead, running the eager recorder's
// vectorised count kernel (counts.cpp): one more pass over the value, which
// is in cache right after its producer wrote it.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "counts.h"

namespace nanscope {
namespace {

constexpr int64_t kWidth = 6;  // -inf, +inf, NaN, < 0, == 0, > 0 (the infinities included)

at::Tensor counts_cpu(const at::Tensor& x) {
  at::Tensor out = at::empty({kWidth}, at::TensorOptions().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t n = x.numel();
  Counts c;
  Special s;
  if (count_tensor(x, &c, &s, /*want_special=*/true)) {
    o[0] = s.ninf;
    o[1] = s.pinf;
    o[2] = s.nan;
    o[3] = c.neg;
    o[4] = c.zero;
    o[5] = n - c.neg - c.zero - s.nan;
    return out;
  }
  // A float type the kernel does not read (float8, say): counted with ATen ops.
  const double inf = std::numeric_limits<double>::infinity();
  o[0] = x.eq(-inf).sum().item<int64_t>();
  o[1] = x.eq(inf).sum().item<int64_t>();
  o[2] = x.ne(x).sum().item<int64_t>();
  o[3] = x.lt(0).sum().item<int64_t>();
  o[4] = x.eq(0).sum().item<int64_t>();
  o[5] = x.gt(0).sum().item<int64_t>();
  return out;
}

// nanscope_graph::statistics: [mean, std, l2, hash] of one CPU float value (counts.h),
// float64; NaN where the kernel does not read the dtype or the layout.
at::Tensor statistics_cpu(const at::Tensor& x) {
  at::Tensor out = at::empty({4}, at::TensorOptions().dtype(at::kDouble));
  double* o = out.data_ptr<double>();
  Statistics st;
  if (tensor_statistics(x, &st)) {
    o[0] = st.mean, o[1] = st.std, o[2] = st.l2, o[3] = st.hash;
  } else {
    o[0] = o[1] = o[2] = o[3] = std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

at::Tensor statistics_meta(const at::Tensor& x) {
  return at::empty({4}, x.options().dtype(at::kDouble).device(at::kMeta));
}

at::Tensor counts_meta(const at::Tensor& x) {
  return at::empty({kWidth}, x.options().dtype(at::kLong).device(at::kMeta));
}

}  // namespace
}  // namespace nanscope

// A namespace of its own: the extension's other files may define one for theirs.
TORCH_LIBRARY(nanscope_graph, m) {
  m.def("counts(Tensor x) -> Tensor");
  m.def("statistics(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(nanscope_graph, CPU, m) {
  m.impl("counts", nanscope::counts_cpu);
  m.impl("statistics", nanscope::statistics_cpu);
}
TORCH_LIBRARY_IMPL(nanscope_graph, Meta, m) {
  m.impl("counts", nanscope::counts_meta);
  m.impl("statistics", nanscope::statistics_meta);
}
