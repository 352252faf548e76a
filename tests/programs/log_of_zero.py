"""A tiny PyTorch model whose loss takes the log of a zero: ``python log_of_zero.py LOGDIR``.

The softmax of large logits saturates, some probabilities are exactly 0, ``torch.log`` turns
them into -inf, and the zeros of the one-hot labels times -inf make NaN: the tutorial's
cross-entropy, whose root cause is ``aten.log.default``.
"""

import sys

import torch

import nanscope

nanscope.enable_dump_debug_info(sys.argv[1])
torch.manual_seed(0)
layer = torch.nn.Linear(4, 3)
x = torch.randn(8, 4)
labels = torch.nn.functional.one_hot(torch.arange(8) % 3, 3).float()
probs = torch.softmax(layer(x) * 1e4, dim=1)  # saturated: some probabilities are exactly 0
loss = -(labels * torch.log(probs)).sum(dim=1).mean()  # -inf * 0: NaN
loss.backward()
nanscope.disable_dump_debug_info()
print("loss", loss.item())
