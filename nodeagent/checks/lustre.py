"""LustreReady: every configured mount present as configured, healthy and responsive. Pure."""

from __future__ import annotations

from nodeagent.config import Config, LustreMount
from nodeagent.model.conditions import LUSTRE_READY, Finding, Problem, Problems
from nodeagent.model.lustre import HealthState, LustreObservation


def fsname(source: str) -> str:
    """'10.0.0.1@o2ib:10.0.0.2@o2ib:/scratch' -> 'scratch' (the Lustre filesystem name)."""
    return source.rsplit(":/", 1)[-1].strip("/")


def mount_problems(m: LustreMount, obs: LustreObservation) -> list[Problem]:
    """One mount's problems, worst first."""
    entry = obs.mounts.get(m.mountpoint)
    if entry is None:
        return [Problem("NotMounted", f"{m.mountpoint}: not mounted")]
    if entry.fstype != m.fstype:
        return [Problem("WrongType", f"{m.mountpoint}: type {entry.fstype}, want {m.fstype}")]
    out = Problems(LUSTRE_READY)
    if entry.source != m.source:
        out.fail("WrongSource", f"{m.mountpoint}: source {entry.source}, want {m.source}")
    missing = [o for o in m.options if o not in entry.options]
    if missing:
        out.fail("MissingOption", f"{m.mountpoint}: missing option(s) {','.join(missing)}")
    probe = obs.statfs.get(m.mountpoint)
    if probe is not None and not probe.done:
        what = "still stuck from an earlier probe" if probe.already_running else "no answer"
        out.fail("MountHung", f"{m.mountpoint}: statfs {what} after {probe.seconds:.1f}s "
                              f"(timeout {m.timeout:g}s)")
    elif probe is not None and not probe.ok:
        out.fail("MountError", f"{m.mountpoint}: statfs failed: {probe.output.strip()[:200]}")
    if obs.lfs is not None and m.fstype == "lustre":
        name = fsname(m.source)
        down = sorted(t for t, status in obs.lfs.items()
                      if t.startswith(f"{name}-") and not status.startswith("active"))
        if down:
            out.fail("TargetUnreachable", f"{m.mountpoint}: unreachable targets "
                                          f"{', '.join(down)}")
        elif obs.lfs_error:
            out.unknown("TargetCheckFailed", f"{m.mountpoint}: {obs.lfs_error}")
    return out.found


def lustre_finding(cfg: Config, obs: LustreObservation | None) -> Finding:
    problems = Problems(LUSTRE_READY)
    if not cfg.lustre:
        return problems.finding("NotConfigured", "no lustre mounts configured")
    if obs is None:
        problems.unknown("NotYetChecked", "Lustre mounts not checked yet")
        return problems.folded()
    if any(m.fstype == "lustre" for m in cfg.lustre):
        h = obs.health
        if h.state in (HealthState.UNHEALTHY, HealthState.LBUG):
            problems.fail("LustreUnhealthy", f"Lustre client "
                          f"{'LBUG' if h.state is HealthState.LBUG else 'NOT HEALTHY'}: {h.detail}")
        elif h.state is HealthState.UNREADABLE:
            problems.unknown("HealthUnreadable", f"Lustre health_check: {h.detail}")
    for m in cfg.lustre:
        problems.extend(mount_problems(m, obs))
    names = ", ".join(m.mountpoint for m in cfg.lustre)
    return problems.finding("MountsHealthy", f"mounted and responsive: {names}")
