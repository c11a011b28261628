"""CustomChecksPassed from the latest run of each custom check. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.config import Config
from nodeagent.model.conditions import CUSTOM_CHECKS_PASSED, Finding, Problems
from nodeagent.model.status import CustomCheckResult


def custom_finding(cfg: Config, results: Mapping[str, CustomCheckResult]) -> Finding:
    """False with the first failing check's reason (checks in config order), else Unknown
    while any check is unknown or has not run yet, else True. The message names every
    check that is not ok, with what it printed."""
    problems = Problems(CUSTOM_CHECKS_PASSED)
    cc = cfg.custom_checks
    if cc is None:
        return problems.finding("NotConfigured", "no custom_checks configured")
    fine = []
    for check in cc.checks:
        got = results.get(check.name)
        if got is None:
            problems.unknown("CustomCheckUnknown", f"{check.name}: not run yet")
        elif got.verdict == "problem":
            problems.fail(check.reason, f"{check.name}: {got.message or 'problem (exit 1)'}")
        elif got.verdict == "unknown":
            problems.unknown("CustomCheckUnknown", f"{check.name}: {got.message or 'unknown'}")
        else:
            fine.append(check.name)
    return problems.finding("CustomChecksPassed",
                            f"{len(fine)} check(s) passed: {', '.join(fine)}")
