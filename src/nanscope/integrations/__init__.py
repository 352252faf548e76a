"""Integrations with training frameworks: callbacks that record a fit with nanscope.

Each lives in a module of its own, imported only when asked for (importing
:mod:`nanscope` imports none of these frameworks).
"""
