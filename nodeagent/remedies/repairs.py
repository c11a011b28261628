"""What a pass or an event repaired, and what failed: reported together by the pass that
follows, whoever ran them (the loop, or the netlink thread's fast lane)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from nodeagent.io.systemd import RAIL
from nodeagent.remedies.network import Action

log = logging.getLogger(__name__)


@dataclass
class Repairs:
    done: dict[str, list[Action]] = field(default_factory=dict)  # rail -> ran (or planned)
    errors: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # repairs outside the rails (remounts)

    def texts(self) -> list[str]:
        return [a.text for acts in self.done.values() for a in acts] + self.other

    def record(self, rail: str, done: list[Action], errors: list[str]) -> None:
        """What ran on a rail (logged as repaired) and what failed (logged as errors)."""
        self.errors.extend(errors)
        for line in errors:
            log.error("%s", line)
        if done:
            self.done[rail] = done
            for a in done:
                log.info("repaired %s", a.text, extra={RAIL: rail})

    def merge(self, other: Repairs) -> None:
        for name, actions in other.done.items():
            self.done.setdefault(name, []).extend(actions)
        self.errors.extend(other.errors)
        self.other.extend(other.other)
