"""CustomChecksPassed from the latest run of each custom check. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.config import Config
from nodeagent.model import CUSTOM_CHECKS_PASSED, CustomCheckResult, Finding


def custom_finding(cfg: Config, results: Mapping[str, CustomCheckResult]) -> Finding:
    """False with the first failing check's reason (checks in config order), else Unknown
    while any check is unknown or has not run yet, else True. The message names every
    check that is not ok, with what it printed."""
    cc = cfg.custom_checks
    if cc is None:
        return Finding(CUSTOM_CHECKS_PASSED, "True", "NotConfigured",
                       "no custom_checks configured")
    failed, unknown, fine = [], [], []
    for check in cc.checks:
        got = results.get(check.name)
        if got is None:
            unknown.append(f"{check.name}: not run yet")
        elif got.verdict == "problem":
            failed.append((check.reason, f"{check.name}: {got.message or 'problem (exit 1)'}"))
        elif got.verdict == "unknown":
            unknown.append(f"{check.name}: {got.message or 'unknown'}")
        else:
            fine.append(check.name)
    if failed:
        return Finding(CUSTOM_CHECKS_PASSED, "False", failed[0][0],
                       "; ".join(m for _, m in failed + [("", u) for u in unknown]))
    if unknown:
        return Finding(CUSTOM_CHECKS_PASSED, "Unknown", "CustomCheckUnknown", "; ".join(unknown))
    return Finding(CUSTOM_CHECKS_PASSED, "True", "CustomChecksPassed",
                   f"{len(fine)} check(s) passed: {', '.join(fine)}")
