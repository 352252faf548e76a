"""nanscope inside other tools (each integration is imported only by the tool that uses it)."""
