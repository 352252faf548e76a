"""Source files as token lists for the page: highlighted on the server, rendered as text.

The page never receives HTML made from a dump: each line is a list of
``[token class, text]`` pairs (pygments' short class names, as its HTML
formatter uses), and the page puts the text into elements itself.
"""

from __future__ import annotations

from pygments.lexer import Lexer
from pygments.lexers import PythonLexer, TextLexer, get_lexer_for_filename
from pygments.token import STANDARD_TYPES, _TokenType
from pygments.util import ClassNotFound

# Files longer than this are sent as plain text: highlighting them would stall a request.
MAX_HIGHLIGHTED_CHARS = 2_000_000


def _lexer(path: str) -> Lexer:
    try:
        return get_lexer_for_filename(path, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return (
            PythonLexer(stripnl=False, ensurenl=False) if not path.startswith("<") else TextLexer()
        )


def _css_class(ttype: _TokenType) -> str:
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    cls: str = STANDARD_TYPES[ttype]
    return cls


def tokenize(path: str, lines: list[str]) -> list[list[list[str]]]:
    """One list of ``[class, text]`` per line; adjacent tokens of one class are merged."""
    text = "\n".join(line.rstrip("\r\n") for line in lines)
    if len(text) > MAX_HIGHLIGHTED_CHARS:
        return [[["", line.rstrip("\r\n")]] for line in lines]
    out: list[list[list[str]]] = [[]]
    for ttype, value in _lexer(path).get_tokens(text):
        cls = _css_class(ttype)
        for k, piece in enumerate(value.split("\n")):
            if k:
                out.append([])
            if not piece:
                continue
            line = out[-1]
            if line and line[-1][0] == cls:
                line[-1][1] += piece
            else:
                line.append([cls, piece])
    # Keep exactly one entry per recorded line.
    del out[len(lines) :]
    while len(out) < len(lines):
        out.append([])
    return out
