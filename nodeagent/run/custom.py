"""The custom-checks thread: runs each configured check at its own interval, off the main
loop, and hands the latest results over after every round.

node-problem-detector's custom-plugin convention, so the scripts sites already run carry
over: exit 0 OK, 1 a problem, 2 unknown (and any other code: unknown); the first line of
stdout is the message. A check past its timeout is killed with its process group and counts
as unknown; one that cannot be started is unknown, naming why.
"""

from __future__ import annotations

import time

from nodeagent.checks.facts import CustomChecksSeen
from nodeagent.config import Config, CustomCheck
from nodeagent.io.commands import ProcessGroups, run_bounded
from nodeagent.io.files import printable
from nodeagent.io.periodic import Periodic
from nodeagent.model.status import CustomCheckResult
from nodeagent.run.work import Deliver

MESSAGE_MAX = 200


def run_check(check: CustomCheck, groups: ProcessGroups | None = None) -> CustomCheckResult:
    run = run_bounded(check.command, check.timeout, groups=groups)
    lines = run.output.decode("utf-8", errors="replace").splitlines()
    first = printable(next((line.strip() for line in lines if line.strip()), ""))
    first = first[:MESSAGE_MAX]
    if run.returncode is None:
        return CustomCheckResult(check.name, "unknown", run.error or "did not finish",
                                 run.seconds)
    if run.returncode == 0:
        return CustomCheckResult(check.name, "ok", first, run.seconds)
    if run.returncode == 1:
        return CustomCheckResult(check.name, "problem", first or "exit 1", run.seconds)
    code = run.returncode
    said = f"exit {code}" if code >= 0 else f"killed by signal {-code}"
    return CustomCheckResult(check.name, "unknown", f"{first} ({said})" if first else said,
                             run.seconds)


def run_all(cfg: Config) -> dict[str, CustomCheckResult]:
    """Every check once, in order (the CLI's one-shot check)."""
    return {c.name: run_check(c) for c in (cfg.custom_checks.checks if cfg.custom_checks
                                           else [])}


class CustomChecksMonitor(Periodic):
    """Runs the checks that are due, one at a time (a hung one costs at most its timeout),
    and delivers every result so far after each round."""

    def __init__(self, cfg: Config, deliver: Deliver) -> None:
        super().__init__("custom-checks")
        self.cfg = cfg
        self.deliver = deliver
        self.results: dict[str, CustomCheckResult] = {}
        self._due: dict[str, float] = {}
        self.running = ProcessGroups()  # the check running now, killed by stop()

    def turn(self) -> float:
        checks = self.cfg.custom_checks.checks if self.cfg.custom_checks else []
        names = {c.name for c in checks}
        self.results = {n: r for n, r in self.results.items() if n in names}
        now = time.monotonic()
        ran = False
        for check in checks:
            if self.halted:
                return 0.0
            if self._due.get(check.name, 0.0) <= now:
                self.results[check.name] = run_check(check, self.running)
                self._due[check.name] = time.monotonic() + check.interval
                ran = True
        if ran and not self.halted:  # a check stop() killed is no result
            self.deliver(CustomChecksSeen(dict(self.results)))
        nxt = min((self._due.get(c.name, 0.0) for c in checks), default=now + 30.0)
        return max(0.05, nxt - time.monotonic())

    def wake(self) -> None:
        """New settings: run every check now."""
        self._due.clear()
        super().wake()

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg
        self.wake()

    def stop(self) -> None:
        """The check running now is killed with its group, here and now: the daemon's
        exit does not wait for it, and nothing it started may outlive the agent."""
        super().stop()
        self.running.kill_all()
