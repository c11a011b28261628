"""A thread's wait that other threads can cut short (`wake`) or end for good (`halt`).

A wake that comes while the owner is busy is kept until the owner clears it: the owner
clears before it reads what the wake announced, so nothing announced after the read is
lost.
"""

from __future__ import annotations

import threading


class Alarm:
    def __init__(self) -> None:
        self._wake = threading.Event()
        self._halt = threading.Event()

    @property
    def halted(self) -> bool:
        return self._halt.is_set()

    def wake(self) -> None:
        self._wake.set()

    def halt(self) -> None:
        self._halt.set()
        self._wake.set()

    def clear(self) -> None:
        self._wake.clear()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when woken (or halted) meanwhile."""
        return self._wake.wait(max(0.0, seconds))

    def linger(self, seconds: float) -> None:
        """Sleep up to `seconds`, ended early by a halt only (wakes meanwhile are kept)."""
        self._halt.wait(max(0.0, seconds))
