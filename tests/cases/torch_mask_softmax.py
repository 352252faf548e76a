"""An intentional -inf attention mask; one query has every key masked, so its softmax is NaN.

The first -inf is the mask itself (masked_fill): intended, but still where the
first non-finite value was born. The first NaN is the softmax of the fully
masked row.
"""
# EXPECT origin.op_type=aten.masked_fill.Scalar origin_kind=born origin.counts.neg_inf=6
# EXPECT first_nan.op_type=aten._softmax.default
# EXPECT first_nan.explanation~="softmax of a row that is entirely -inf"

import torch

torch.manual_seed(0)
q = torch.randn(3, 4)
k = torch.randn(3, 4)
scores = q @ k.T / 2.0
keep = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
scores = scores.masked_fill(~keep, float("-inf"))  # <- origin first_inf
attn = torch.softmax(scores, dim=-1)  # <- first_nan
print(attn.tolist())
