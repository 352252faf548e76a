"""x/0: a per-class mean divides by a class count that is zero."""
# EXPECT origin.op_type=aten.div.Tensor origin_kind=born origin.explanation~="x/0"
# EXPECT origin.counts.pos_inf=1 first_nan=null

import torch

values = torch.tensor([1.0, 2.0, 3.0, 4.0])
classes = torch.tensor([0, 0, 2, 2])
totals = torch.zeros(3).index_add(0, classes, values)
counts = torch.zeros(3).index_add(0, classes, torch.ones(4))
totals = totals + torch.tensor([0.0, 1.0, 0.0])  # class 1 has a bias but no members
means = totals / counts  # <- origin first_inf
print(means.tolist())
