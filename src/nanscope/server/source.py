"""Source files as token lists for the page: highlighted on the server, rendered as text.

The page never receives HTML made from a dump: each line is a list of
``[token class, text]`` pairs (pygments' short class names, as its HTML
formatter uses), and the page puts the text into elements itself.

A recorded file's name and text are the dump's, so an attacker's: highlighting is bounded.
Only a short allow-list of lexers is used (pygments picks by file name among hundreds, and
some are quadratic on crafted input: 120 KB of ``.php`` took 38 s to 89 s), only files up to
:data:`MAX_HIGHLIGHTED_CHARS` are highlighted, a lexer that runs past
:data:`HIGHLIGHT_SECONDS` is abandoned, and one file is lexed at a time. Anything else
is sent as plain text (``highlighted: false``), which the page shows just the same.
Callers highlight outside a run's lock (see ``api.source_route``): a slow file then
delays only its own request.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath

from pygments.lexer import Lexer
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES, _TokenType

# Files longer than this (in characters) are sent as plain text: even a linear lexer takes
# about a second per 300 KB of dense Python, and the largest common library files
# (torch's generated tables) are past it.
MAX_HIGHLIGHTED_CHARS = 512_000
# A file still being lexed after this many seconds is sent as plain text (and remembered
# so, so that asking again costs nothing): regex lexers can be quadratic on crafted input.
HIGHLIGHT_SECONDS = 2.0
# The deadline is checked every this many tokens (each token is one bounded regex match).
_CHECK_EVERY = 64
# Highlighted files kept, by total characters (a token list takes ~100 bytes per token).
CACHE_CHARS = 2_000_000

# The allow-list: file name suffix (lower case) -> lexer. Python first and only: dumps
# record the Python files of stack frames. A name without a suffix (a script run as
# ``./train``) is read as Python too; names such as ``<frozen os>`` or ``<string>`` are
# not files and are sent as plain text.
_LEXERS: dict[str, Callable[[], Lexer]] = {
    ".py": lambda: PythonLexer(stripnl=False, ensurenl=False),
    ".pyw": lambda: PythonLexer(stripnl=False, ensurenl=False),
    ".pyi": lambda: PythonLexer(stripnl=False, ensurenl=False),
}

Lines = list[list[list[str]]]


@dataclass(frozen=True)
class Highlighted:
    """A file's lines as token lists; ``highlighted`` is False when sent as plain text, and
    ``why`` then says why (``None`` when highlighted)."""

    lines: Lines
    highlighted: bool
    why: str | None = None


def lexer_for(path: str) -> Lexer | None:
    """The allow-listed lexer for a recorded file name, or None (plain text)."""
    if path.startswith("<"):
        return None
    name = PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name
    suffix = PurePosixPath(name).suffix.lower()
    make = _LEXERS.get(suffix) if suffix else _LEXERS[".py"]
    return make() if make is not None else None


def _css_class(ttype: _TokenType) -> str:
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    cls: str = STANDARD_TYPES[ttype]
    return cls


def plain(lines: list[str]) -> Lines:
    """Each line as one plain token (what the page shows when nothing is highlighted)."""
    return [[["", line.rstrip("\r\n")]] for line in lines]


class _Deadline(Exception):
    """The lexer ran past its time."""


def _lex(lexer: Lexer, text: str, n_lines: int, deadline: float) -> Lines:
    """Token lists per line; raises :class:`_Deadline` past ``deadline`` (monotonic)."""
    out: Lines = [[]]
    for k, (ttype, value) in enumerate(lexer.get_tokens(text)):
        if k % _CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise _Deadline
        cls = _css_class(ttype)
        for j, piece in enumerate(value.split("\n")):
            if j:
                out.append([])
            if not piece:
                continue
            line = out[-1]
            if line and line[-1][0] == cls:
                line[-1][1] += piece
            else:
                line.append([cls, piece])
    # Keep exactly one entry per recorded line.
    del out[n_lines:]
    while len(out) < n_lines:
        out.append([])
    return out


class Highlighter:
    """Highlights recorded files within a size and time budget, one at a time, remembering
    the last ones (by content, so a file rewritten in a live dump is highlighted again)."""

    def __init__(
        self,
        max_chars: int = MAX_HIGHLIGHTED_CHARS,
        seconds: float = HIGHLIGHT_SECONDS,
        cache_chars: int = CACHE_CHARS,
    ) -> None:
        self.max_chars = max_chars
        self.seconds = seconds
        self.cache_chars = cache_chars
        # One file is lexed at a time: lexing holds the GIL, and several hostile files
        # lexed at once would each slow every other request of the server.
        self._lexing = threading.Lock()
        self._lock = threading.Lock()  # guards _cache and _chars
        self._cache: OrderedDict[tuple[str, str], tuple[int, Highlighted]] = OrderedDict()
        self._chars = 0

    def __call__(self, path: str, lines: list[str]) -> Highlighted:
        text = "\n".join(line.rstrip("\r\n") for line in lines)
        lexer = lexer_for(path)
        if lexer is None:
            return Highlighted(plain(lines), False, "not a file type that is highlighted")
        if len(text) > self.max_chars:
            return Highlighted(plain(lines), False, f"longer than {self.max_chars:,} characters")
        key = (type(lexer).__name__, hashlib.sha256(text.encode("utf-8", "replace")).hexdigest())
        hit = self._get(key)
        if hit is not None:
            return hit
        # Waiting for another file's lexing counts against this one's time: a request
        # never waits much longer than the budget, whatever others ask.
        start = time.monotonic()
        if not self._lexing.acquire(timeout=self.seconds):
            return Highlighted(plain(lines), False, "the server was busy highlighting another file")
        try:
            hit = self._get(key)  # lexed meanwhile by the request that held the lock
            if hit is not None:
                return hit
            try:
                result = Highlighted(_lex(lexer, text, len(lines), start + self.seconds), True)
            except _Deadline:
                # Remembered too: asking again for a file that is slow to lex costs nothing.
                result = Highlighted(
                    plain(lines), False, f"highlighting took longer than {self.seconds:g} s"
                )
        finally:
            self._lexing.release()
        self._put(key, len(text), result)
        return result

    def _get(self, key: tuple[str, str]) -> Highlighted | None:
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return None
            self._cache.move_to_end(key)
            return entry[1]

    def _put(self, key: tuple[str, str], size: int, value: Highlighted) -> None:
        size = max(size, 1)
        if size > self.cache_chars:
            return
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = (size, value)
            self._chars += size
            while self._chars > self.cache_chars:
                _, (old, _) = self._cache.popitem(last=False)
                self._chars -= old

    def __len__(self) -> int:
        """Files remembered."""
        with self._lock:
            return len(self._cache)


# The server's highlighter (shared by every run: the cache is keyed by content).
HIGHLIGHTER = Highlighter()
