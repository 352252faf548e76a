"""x/0 with a Python number: a mean over a batch that filtered out every element (len == 0)."""
# EXPECT origin.op_type=aten.div.Tensor origin_kind=born origin.explanation~="x/0"
# XFAIL: a Python-number divisor is not recorded (only tensor arguments are), so the div has one known input and explain() says "div produced +inf from finite inputs" instead of naming the zero divisor (backends/torch/dumping.py DumpingMode._record / ops.tensors_of drop scalar arguments; analysis/explain.py explain() cannot tell x/0 from overflow without them).

import torch

losses = torch.tensor([0.5, 1.5, 0.0])
kept = [v for v in losses.tolist() if v > 2.0]  # nothing passes the filter
mean = losses.sum() / len(kept)  # <- origin
print(mean.item())
