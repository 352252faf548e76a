"""The PyTorch backend: every ATen op, forward, backward and optimizer, as an execution."""
