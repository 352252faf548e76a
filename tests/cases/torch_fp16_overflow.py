"""float16 overflow: a half-precision matmul exceeds 65504."""
# EXPECT origin.op_type=aten.mm.default origin_kind=born
# EXPECT origin.explanation~="overflow in matmul" origin.explanation~="65504"
# EXPECT origin.counts.dtype=float16

import torch

x = torch.full((4, 64), 40.0, dtype=torch.float16)
w = torch.full((64, 8), 30.0, dtype=torch.float16)  # 64 * 40 * 30 = 76800 > 65504
y = torch.mm(x, w)  # <- origin first_inf
print(y[0, 0].item())
