"""The one loop every polling source runs: a turn, then a pause that `wake()` cuts short
and `stop()` ends.

A wake that comes during a turn is kept: the next turn starts as soon as this one ends
(what the turn read may predate what the wake announced). A turn that raises is logged and
the source goes on after its pause: a probe's bug must not end a source silently.
"""

from __future__ import annotations

import logging
import threading

from nodeagent.io.alarm import Alarm

log = logging.getLogger(__name__)


class Periodic(threading.Thread):
    """Subclasses give `turn()`, which returns the seconds until the next turn."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._alarm = Alarm()
        self.turns = 0

    def turn(self) -> float:
        raise NotImplementedError

    def after_failure(self) -> float:
        """The pause after a turn that raised."""
        return 5.0

    def pause(self, seconds: float) -> bool:
        """Sleep until the next turn; True when woken early."""
        return self._alarm.wait(seconds)

    @property
    def halted(self) -> bool:
        return self._alarm.halted

    def run(self) -> None:
        while not self._alarm.halted:
            self._alarm.clear()  # from here on, a wake asks for one more turn
            try:
                delay = self.turn()
            except Exception as exc:
                log.error("%s failed: %s", self.name, exc)
                delay = self.after_failure()
            self.turns += 1
            if self._alarm.halted:
                return
            self.pause(delay)

    def wake(self) -> None:
        self._alarm.wake()

    def stop(self) -> None:
        self._alarm.halt()
