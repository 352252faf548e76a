"""A tiny model whose loss takes the log of a zero."""
import sys

import torch

import nanscope

nanscope.enable_dump_debug_info(sys.argv[1])
torch.manual_seed(0)
w = torch.nn.Linear(4, 3)
x = torch.randn(8, 4)
probs = torch.softmax(w(x) * 1e4, dim=1)  # saturates: some probabilities are exactly 0
loss = -torch.log(probs).mean()
loss.backward()
nanscope.disable_dump_debug_info()
print("loss", loss.item())
