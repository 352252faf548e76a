"""The bug inside an nn.Module layer: an L2 normalisation without eps, fed an all-zero row."""
# EXPECT origin.op_type=aten.div.Tensor origin_kind=born origin.module_path="norm (L2Norm)"
# EXPECT origin.phase=forward origin.explanation~="0/0"

import torch


class L2Norm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed: torch.Tensor = x / x.norm(dim=-1, keepdim=True)  # <- origin first_nan
        return normed


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.act = torch.nn.ReLU()
        self.norm = L2Norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.act(self.proj(x)))
        return out


net = Net()
with torch.no_grad():
    net.proj.weight.fill_(0.1)
    net.proj.bias.fill_(-1.0)  # an all-zero sample leaves every unit dead
x = torch.tensor([[10.0, 10.0, 10.0, 10.0], [0.0, 0.0, 0.0, 0.0]])
print(net(x).tolist())
