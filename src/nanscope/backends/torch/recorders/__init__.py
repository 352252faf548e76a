"""The two eager-op recorders, behind one protocol (:class:`.base.Recorder`).

:mod:`.native` (a dispatch-key kernel in C++, the default) and
:mod:`.python` (a dispatch mode, where the native one cannot be built, or
with ``NANSCOPE_TORCH_RECORDER=python``).
"""
