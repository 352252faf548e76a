"""The seed's bug: softmax underflows to 0, a hand-written cross-entropy takes log(0) = -inf."""
# EXPECT origin.op_type=aten.log.default origin_kind=born origin.explanation~="log of zero"
# EXPECT first_nan.op_type=aten.mul.Tensor first_nan.explanation~="0 * inf"

import torch

logits = torch.tensor([[200.0, 0.0, -5.0], [1.0, 2.0, 3.0]])
labels = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
probs = torch.softmax(logits, dim=1)
log_probs = torch.log(probs)  # <- origin first_inf
loss = torch.mean(-(labels * log_probs))  # <- first_nan
print(float(loss))
