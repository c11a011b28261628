"""The hardware fingerprint as Node label values. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping

_BAD = re.compile(r"[^A-Za-z0-9._-]")


def label_value(text: str) -> str:
    """A valid label value: <= 63 chars of [A-Za-z0-9._-], alphanumeric at both ends."""
    return _BAD.sub("-", text)[:63].strip("._-")


def fingerprint_labels(seen: Mapping[str, set[str]]) -> dict[str, str]:
    """Label values from what the hardware probe saw: one value as is (label-safe), several
    as "mixed"; a label with nothing seen is left out (and removed from the Node)."""
    out = {}
    for label, values in seen.items():
        safe = {label_value(v) for v in values} - {""}
        if len(safe) == 1:
            out[label] = safe.pop()
        elif safe:
            out[label] = "mixed"
    return out
