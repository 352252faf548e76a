"""Integrations with training frameworks: callbacks that record a run into a dump.

Each module imports its framework only when it is imported itself: importing
``nanscope`` (or this package) imports none of them.
"""
