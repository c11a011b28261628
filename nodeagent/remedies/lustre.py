"""The optional Lustre repair: a configured remount command, run with a timeout.

Off unless a mount has `remount_command`. Never while a probe of that mount is stuck: a
remount racing a hung client only adds a second stuck process.
"""

from __future__ import annotations

from nodeagent.config import Config
from nodeagent.io.commands import BoundedRunner
from nodeagent.model.lustre import LustreObservation

REMOUNT_REASONS = ("NotMounted", "WrongSource", "WrongType", "MissingOption")


def remount(
    cfg: Config, obs: LustreObservation, runner: BoundedRunner, problems: dict[str, str]
) -> tuple[list[str], list[str]]:
    """Run remount commands for mounts whose first problem is in REMOUNT_REASONS.

    `problems` maps mountpoint -> reason. Returns (actions done, errors).
    """
    done: list[str] = []
    errors: list[str] = []
    for m in cfg.lustre or []:
        reason = problems.get(m.mountpoint)
        if m.remount_command is None or reason not in REMOUNT_REASONS:
            continue
        probe = obs.statfs.get(m.mountpoint)
        if probe is not None and not probe.done:
            continue
        text = f"{m.mountpoint}: remount ({reason}): {' '.join(m.remount_command)}"
        result = runner.run(f"remount:{m.mountpoint}", list(m.remount_command), m.remount_timeout)
        if result.ok:
            done.append(text)
        elif not result.done:
            errors.append(f"{text}: no answer within {m.remount_timeout:g}s")
        else:
            errors.append(f"{text}: failed: {result.output.strip()[:200]}")
    return done, errors
