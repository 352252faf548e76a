"""0/0 in an in-place op: an L2 normalisation done with div_ on a batch holding an all-zero row."""
# EXPECT origin.op_type=aten.div_.Tensor origin_kind=born origin.explanation~="0/0"

import torch

x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
norms = x.norm(dim=1, keepdim=True)
x.div_(norms)  # <- origin first_nan
print(x.tolist())
