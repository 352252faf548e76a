"""``log(softmax(x))`` by hand, whose backward makes the first NaN: ``python log_of_softmax.py``.

The logits are so large that softmax saturates: some probabilities are exactly 0 and
``torch.log`` makes -inf (harmful: the label of row 0 picks one, so the loss is +inf).
``nll_loss`` reads only the labels' entries, so the forward pass makes no NaN; the
backward of ``log`` is ``grad / probs``, which is 0/0 = NaN where a probability is 0 and
its gradient is 0 too. The first NaN is that backward ``div``; the line to fix is the
forward ``torch.log(probs)`` (use ``log_softmax``).
"""

import torch

torch.manual_seed(0)
layer = torch.nn.Linear(4, 3)
x = torch.randn(8, 4)
y = torch.arange(8) % 3
opt = torch.optim.SGD(layer.parameters(), lr=0.1)
for _step in range(2):
    probs = torch.softmax(layer(x) * 1e4, dim=1)  # saturated: some are exactly 0
    logp = torch.log(probs)  # <- forward: -inf, and its backward divides by 0
    loss = torch.nn.functional.nll_loss(logp, y)
    opt.zero_grad()
    loss.backward()  # <- the backward div: 0/0 = NaN
    opt.step()
    print("loss", loss.item())
