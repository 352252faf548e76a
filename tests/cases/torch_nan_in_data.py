"""NaN already in the input batch (a missing value): it entered through from_numpy, no op made it."""
# EXPECT origin.op_type=aten.lift_fresh.default origin_kind=entered origin.external_input=true
# EXPECT origin.explanation~="already in an input that no recorded op produced"

import numpy as np
import torch

batch = np.array([[0.5, 1.0, 2.0], [1.5, np.nan, 0.0]], dtype=np.float32)
layer = torch.nn.Linear(3, 2)
x = torch.from_numpy(batch)  # <- origin first_nan
y = layer(x)
print(y.tolist())
