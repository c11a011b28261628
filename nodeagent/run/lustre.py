"""Lustre, end to end for one look: probe -> (optional remount -> probe) -> observation.

Used synchronously by `check`/`apply` and from the daemon's Lustre thread, so a hung mount
never holds up the netlink loop.
"""

from __future__ import annotations

import logging

from nodeagent.checks.facts import LustreSeen
from nodeagent.checks.lustre import mount_problems
from nodeagent.config import Config
from nodeagent.io.commands import BoundedRunner
from nodeagent.io.periodic import Periodic
from nodeagent.model.lustre import LustreObservation
from nodeagent.probes.lustre import observe_lustre
from nodeagent.remedies.lustre import remount
from nodeagent.run.work import Deliver

log = logging.getLogger(__name__)


def look(cfg: Config, runner: BoundedRunner) -> LustreObservation:
    mounts = [(m.mountpoint, m.fstype, m.timeout) for m in cfg.lustre or []]
    return observe_lustre(mounts, cfg.paths.sysfs, cfg.paths.procfs, cfg.paths.lfs, runner)


def look_and_repair(
    cfg: Config, runner: BoundedRunner, repair: bool
) -> tuple[LustreObservation, list[str], list[str]]:
    obs = look(cfg, runner)
    if not repair:
        return obs, [], []
    first = {}
    for m in cfg.lustre or []:
        problems = mount_problems(m, obs)
        if problems:
            first[m.mountpoint] = problems[0].reason
    done, errors = remount(cfg, obs, runner, first)
    if done:
        obs = look(cfg, runner)
    return obs, done, errors


class LustreMonitor(Periodic):
    """The Lustre source: probes the mounts every `lustre_interval` (a remount when one is
    configured and due) and delivers each look as LustreSeen."""

    def __init__(self, cfg: Config, deliver: Deliver):
        super().__init__("lustre-monitor")
        self.cfg = cfg
        self.deliver = deliver
        self.runner = BoundedRunner()

    def turn(self) -> float:
        obs, done, errors = look_and_repair(self.cfg, self.runner, repair=True)
        for line in errors:
            log.error("%s", line)
        self.deliver(LustreSeen(obs, tuple(done)))
        return self.cfg.lustre_interval

    def after_failure(self) -> float:
        return self.cfg.lustre_interval

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg  # the next turn, at the old interval: a remount is not hurried
