"""The tfdbg2 on-disk format: protos, record framing, file sets, summaries, tensors.

Nothing here imports a deep-learning framework.
"""
