"""inf - inf: a naive variance E[x^2] - E[x]^2 overflows both terms in float32."""
# EXPECT origin.op_type=aten.pow.Tensor_Scalar origin_kind=born
# EXPECT origin.explanation~="overflow in pow"
# EXPECT first_nan.op_type=aten.sub.Tensor first_nan.explanation~="inf - inf"

import torch

x = torch.tensor([1e20, 3e20, 2e20])
mean_sq = (x**2).mean()  # <- origin first_inf
sq_mean = x.mean() ** 2
var = mean_sq - sq_mean  # <- first_nan
print(var.item())
