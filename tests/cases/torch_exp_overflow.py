"""exp overflow: a hand-written softmax without subtracting the max (inf/inf -> NaN)."""
# EXPECT origin.op_type=aten.exp.default origin_kind=born
# EXPECT origin.explanation~="overflow in exp" origin.explanation~="float32"
# EXPECT first_nan.op_type=aten.div.Tensor

import torch

logits = torch.tensor([[10.0, 20.0, 30.0], [50.0, 100.0, 90.0]])
e = torch.exp(logits)  # <- origin first_inf
probs = e / e.sum(dim=1, keepdim=True)  # <- first_nan
print(probs.tolist())
