"""The base of the enums whose members are their words."""

from __future__ import annotations

import enum


class Words(str, enum.Enum):
    """An enum whose members are their words: a str, and str() and f-strings give the word
    (enum.StrEnum, which Python 3.10 lacks)."""

    def __str__(self) -> str:
        return str(self.value)
