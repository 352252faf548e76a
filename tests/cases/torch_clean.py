"""A clean program: nothing non-finite, the report exits 0."""
# EXPECT found_nonfinite=false origin=null origin_kind=null

import torch

x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
loss = torch.log(torch.softmax(x, dim=1) + 1e-6).sum()
loss.backward()
assert x.grad is not None
print(loss.item(), x.grad.tolist())
