"""sqrt of a negative number: a distance computed by hand goes slightly below zero."""
# EXPECT origin.op_type=aten.sqrt.default origin_kind=born
# EXPECT origin.explanation~="sqrt of a negative number"

import torch

a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
b = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
# |a|^2 + |b|^2 - 2 a.b, with a constant that rounds it below zero for equal rows
sq = (a * a).sum(1) + (b * b).sum(1) - 2 * (a * b).sum(1) - 1e-3
dist = torch.sqrt(sq)  # <- origin first_nan
print(dist.tolist())
