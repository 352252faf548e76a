"""NaN born in backward inside a module: the gradient of a Euclidean distance at distance 0.

Forward is finite (sqrt(0) = 0). Backward, sqrt's gradient 1/(2*sqrt(0)) is
+inf, and pow's gradient 2*d multiplies it by d = 0: NaN. Both backward ops
belong to the forward ops of the `dist (Distance)` layer.
"""
# EXPECT origin.phase=backward origin_kind=born origin.forward_op=aten.sqrt.default
# EXPECT origin.module_path="dist (Distance)" origin.counts.pos_inf=1
# EXPECT first_nan.phase=backward first_nan.forward_op=aten.pow.Tensor_Scalar
# EXPECT first_nan.module_path="dist (Distance)" first_nan.explanation~="0 * inf"

import torch


class Distance(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        d = a - b
        sq = (d**2).sum(-1)  # <- first_nan.forward
        return torch.sqrt(sq)  # <- origin.forward


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(2, 2)
        self.dist = Distance()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        distance: torch.Tensor = self.dist(self.embed(a), self.embed(b))
        return distance


net = Net()
a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
b = torch.tensor([[1.0, 2.0], [0.0, 0.0]])  # the first pair is identical: distance 0
loss = net(a, b).sum()
loss.backward()  # <- origin first_nan
assert net.embed.weight.grad is not None
print(net.embed.weight.grad.tolist())
