"""Query parameters of the JSON API, parsed into typed values with 400 errors that say why."""

from __future__ import annotations

from collections.abc import Mapping

from nanscope.reader import EXECUTIONS, TRACES, DumpReader

KINDS = (EXECUTIONS, TRACES)
MAX_PAGE = 1000


class ApiError(Exception):
    """A request the API refuses: ``status`` 400 or 404, and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Query:
    """Typed access to query parameters, with 400 errors that say what is wrong."""

    def __init__(self, params: Mapping[str, str]) -> None:
        self._params = params

    def text(self, name: str, default: str | None = None, max_len: int = 4096) -> str | None:
        value = self._params.get(name)
        if value is None:
            return default
        if len(value) > max_len:
            raise ApiError(400, f"parameter {name} is longer than {max_len} characters")
        return value

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise ApiError(400, f"parameter {name} is required")
        return value

    def integer(
        self, name: str, default: int | None = None, lo: int | None = None, hi: int | None = None
    ) -> int:
        raw = self.text(name, max_len=20)
        if raw is None or raw == "":
            if default is None:
                raise ApiError(400, f"parameter {name} is required (an integer)")
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, f"parameter {name} must be an integer, not {raw[:40]!r}") from None
        if lo is not None and value < lo:
            raise ApiError(400, f"parameter {name} must be at least {lo} (got {value})")
        if hi is not None and value > hi:
            raise ApiError(400, f"parameter {name} must be at most {hi} (got {value})")
        return value

    def optional_int(self, name: str, lo: int | None = None) -> int | None:
        if self.text(name, max_len=20) in (None, ""):
            return None
        return self.integer(name, lo=lo)

    def flag(self, name: str) -> bool:
        raw = self.text(name, "0", max_len=5)
        if raw in ("1", "true", "yes"):
            return True
        if raw in ("0", "false", "no", ""):
            return False
        raise ApiError(400, f"parameter {name} must be 1 or 0, not {raw!r}")

    def kind(self, name: str = "kind") -> str:
        value = self.text(name, EXECUTIONS, max_len=40) or EXECUTIONS
        if value not in KINDS:
            raise ApiError(400, f"parameter {name} must be 'execution' or 'graph_execution_trace'")
        return value

    def page(self, total: int) -> tuple[int, int]:
        """``begin``/``end`` of a list page (at most :data:`MAX_PAGE` events), clamped to ``total``."""
        begin = self.integer("begin", 0, lo=0)
        end = self.integer("end", min(total, begin + 100), lo=0)
        if end < begin:
            raise ApiError(400, f"end ({end}) is before begin ({begin})")
        if end - begin > MAX_PAGE:
            raise ApiError(400, f"a page holds at most {MAX_PAGE} events (asked {end - begin})")
        return min(begin, total), min(end, total)

    def process(self, reader: DumpReader) -> int | None:
        """The ``process`` parameter, checked against the run's processes (404 if absent)."""
        p = self.optional_int("process", lo=0)
        if p is not None and p >= len(reader.processes):
            raise ApiError(404, f"no process {p} in this run ({len(reader.processes)} processes)")
        return p
