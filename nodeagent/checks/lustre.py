"""LustreReady: every configured mount present as configured, healthy and responsive. Pure."""

from __future__ import annotations

from nodeagent.config import Config, LustreMount
from nodeagent.model import LUSTRE_READY, ConditionStatus, Finding, LustreObservation


def fsname(source: str) -> str:
    """'10.0.0.1@o2ib:10.0.0.2@o2ib:/scratch' -> 'scratch' (the Lustre filesystem name)."""
    return source.rsplit(":/", 1)[-1].strip("/")


def mount_problems(m: LustreMount, obs: LustreObservation) -> list[tuple[str, str, bool]]:
    """(reason, message, unknown?) for one mount, worst first."""
    entry = obs.mounts.get(m.mountpoint)
    if entry is None:
        return [("NotMounted", f"{m.mountpoint}: not mounted", False)]
    if entry.fstype != m.fstype:
        return [("WrongType", f"{m.mountpoint}: type {entry.fstype}, want {m.fstype}", False)]
    out: list[tuple[str, str, bool]] = []
    if entry.source != m.source:
        out.append(("WrongSource", f"{m.mountpoint}: source {entry.source}, want {m.source}",
                    False))
    missing = [o for o in m.options if o not in entry.options]
    if missing:
        out.append(("MissingOption", f"{m.mountpoint}: missing option(s) {','.join(missing)}",
                    False))
    probe = obs.statfs.get(m.mountpoint)
    if probe is not None and not probe.done:
        what = "still stuck from an earlier probe" if probe.already_running else "no answer"
        out.append(("MountHung", f"{m.mountpoint}: statfs {what} after {probe.seconds:.1f}s "
                                 f"(timeout {m.timeout:g}s)", False))
    elif probe is not None and not probe.ok:
        out.append(("MountError", f"{m.mountpoint}: statfs failed: {probe.output.strip()[:200]}",
                    False))
    if obs.lfs is not None and m.fstype == "lustre":
        name = fsname(m.source)
        down = sorted(t for t, status in obs.lfs.items()
                      if t.startswith(f"{name}-") and not status.startswith("active"))
        if down:
            out.append(("TargetUnreachable", f"{m.mountpoint}: unreachable targets "
                                             f"{', '.join(down)}", False))
        elif obs.lfs_error:
            out.append(("TargetCheckFailed", f"{m.mountpoint}: {obs.lfs_error}", True))
    return out


def lustre_finding(cfg: Config, obs: LustreObservation | None) -> Finding:
    if not cfg.lustre:
        return Finding(LUSTRE_READY, "True", "NotConfigured", "no lustre mounts configured")
    if obs is None:
        return Finding(LUSTRE_READY, "Unknown", "NotYetChecked", "Lustre mounts not checked yet")
    problems: list[tuple[str, str, bool]] = []
    for m in cfg.lustre:
        problems += mount_problems(m, obs)
    if any(m.fstype == "lustre" for m in cfg.lustre):
        h = obs.health
        if h.state in ("unhealthy", "lbug"):
            problems.insert(0, ("LustreUnhealthy",
                                f"Lustre client {'LBUG' if h.state == 'lbug' else 'NOT HEALTHY'}"
                                f": {h.detail}", False))
        elif h.state == "unreadable":
            problems.append(("HealthUnreadable", f"Lustre health_check: {h.detail}", True))
    if not problems:
        names = ", ".join(m.mountpoint for m in cfg.lustre)
        return Finding(LUSTRE_READY, "True", "MountsHealthy", f"mounted and responsive: {names}")
    known = any(not unknown for _, _, unknown in problems)
    status: ConditionStatus = "False" if known else "Unknown"
    first = next(p for p in problems if (status == "Unknown") == p[2])
    return Finding(LUSTRE_READY, status, first[0], "; ".join(p[1] for p in problems))
