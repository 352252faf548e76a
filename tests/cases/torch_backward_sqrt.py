"""Born in backward: sqrt(0) is fine forward, but its gradient 1/(2*sqrt(0)) is +inf."""
# EXPECT origin.phase=backward origin_kind=born origin.forward_op=aten.sqrt.default
# EXPECT origin.counts.pos_inf=1

import torch

w = torch.tensor([4.0, 0.0, 9.0], requires_grad=True)
norm = torch.sqrt(w)  # <- forward
loss = norm.sum()
loss.backward()  # <- origin first_inf
assert w.grad is not None
print(w.grad.tolist())
