"""``StringTable``: strings numbered in order of first use (entry 0 is the empty string).

The writer numbers op types, op names and module paths this way for its sidecar
index, and the reader numbers the strings of its columnar index the same way.
"""

from __future__ import annotations


class StringTable:
    """Interns strings to small integers; :meth:`take_new` hands out the entries added since."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self._ids: dict[str, int] = {"": 0}
        self._taken = 1

    def __len__(self) -> int:
        return len(self.strings)

    def intern(self, value: str) -> int:
        """The number of ``value``, adding it if it is new."""
        i = self._ids.get(value)
        if i is None:
            i = self._ids[value] = len(self.strings)
            self.strings.append(value)
        return i

    def get(self, value: str) -> int | None:
        """The number of ``value``, or ``None`` if it was never interned."""
        return self._ids.get(value)

    def take_new(self) -> list[str]:
        """The entries added since the last call (what a writer has not written yet)."""
        new = self.strings[self._taken :]
        self._taken = len(self.strings)
        return new
