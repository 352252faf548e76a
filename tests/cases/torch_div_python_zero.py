"""x/0 with a Python number: a mean over a batch that filtered out every element (len == 0)."""
# EXPECT origin.op_type=aten.div.Tensor origin_kind=born origin.explanation~="x/0"

import torch

losses = torch.tensor([0.5, 1.5, 0.0])
kept = [v for v in losses.tolist() if v > 2.0]  # nothing passes the filter
mean = losses.sum() / len(kept)  # <- origin
print(mean.item())
