"""Example programs: the Debugger V2 tutorial's MNIST bug, for PyTorch, JAX and TensorFlow."""
