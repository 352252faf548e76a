"""log of a negative number: a log-likelihood of a "probability" that went below zero."""
# EXPECT origin.op_type=aten.log.default origin_kind=born
# EXPECT origin.explanation~="log of a negative number" first_inf=null

import torch

p = torch.tensor([0.2, 0.5, 0.9])
q = 1.0 - p - 0.3  # 1 - 0.9 - 0.3 < 0
ll = torch.log(q)  # <- origin first_nan
print(ll.tolist())
