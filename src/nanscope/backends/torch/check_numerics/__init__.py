"""``enable_check_numerics`` for PyTorch: raise at the first NaN or the first harmful Inf.

Its modules, each depending only on those listed before it:

* :mod:`.records`: what is remembered about Inf/NaN (lineages, the ops that wrote them);
* :mod:`.report`: how the error reads (the user's frame, the tensors described);
* :mod:`.rule`: the rule (docs/CHECK_NUMERICS.md), as a dispatch mode;
* :mod:`.native`: the native checker's Python side, which feeds the rule;
* :mod:`.compiled`: ``torch.compile`` graphs, which count their own Inf/NaN;
* :mod:`.session`: turning checking on and off (:class:`TorchCheckNumerics`).
"""

from nanscope.backends.torch.check_numerics.session import TorchCheckNumerics

__all__ = ["TorchCheckNumerics"]
