"""``torch.compile`` under nanscope: graphs recorded, summaries computed inside the compiled code.

:mod:`.rewrite` works at compile time: it records each graph and appends
the summaries' computation to it. :mod:`.calls` works at each call of a
compiled graph: it records the call and the summaries the graph computed.
:mod:`.plan` is what the first hands the second, one per graph.
"""
