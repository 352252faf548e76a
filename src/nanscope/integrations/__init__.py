"""nanscope where users already work: trainer callbacks that record a run into a dump
(Lightning, the Hugging Face ``Trainer``) and a TensorBoard tab.

Each module imports its framework only when it is imported itself: importing
``nanscope`` (or this package) imports none of them.
"""
