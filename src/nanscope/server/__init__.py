"""``nanscope serve``: the web GUI and its read-only JSON API (contract: ``http_api.md``)."""

from nanscope.server.serving import DEFAULT_HOST, DEFAULT_PORT, ServeError, Server, serve_in_thread

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ServeError", "Server", "serve_in_thread"]
