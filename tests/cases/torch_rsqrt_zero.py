"""A hand-written layer norm without eps: a constant row has variance 0, rsqrt(0) = +inf."""
# EXPECT origin.op_type=aten.rsqrt.default origin_kind=born origin.explanation~="rsqrt of zero"
# EXPECT first_nan.op_type=aten.mul.Tensor first_nan.explanation~="0 * inf"

import torch

x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
mu = x.mean(dim=-1, keepdim=True)
var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
inv = torch.rsqrt(var)  # <- origin first_inf
y = (x - mu) * inv  # <- first_nan
print(y.tolist())
