"""0/0: a masked mean over a row whose mask is all zeros."""
# EXPECT origin.op_type=aten.div.Tensor origin_kind=born origin.explanation~="0/0"
# EXPECT origin.counts.nan=1 first_inf=null

import torch

x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
masked_sum = (x * mask).sum(dim=1)
n = mask.sum(dim=1)
mean = masked_sum / n  # <- origin first_nan
print(mean.tolist())
