"""Device-plugin checks that need only Kubernetes objects. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def tolerates_taint(tolerations: Iterable[Mapping[str, Any]], key: str, effect: str) -> bool:
    """Whether a pod with these tolerations may run on a node carrying our taint.

    Only `operator: Exists` counts: the taint's value is the failing reason and changes, so
    an `Equal` toleration would match one reason and be evicted or kept out by the next.
    """
    for t in tolerations:
        if t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator", "Equal") == "Exists" and t.get("key") in (None, "", key):
            return True
    return False


def toleration_problem(daemonset: Mapping[str, Any], key: str, effect: str) -> str | None:
    """A message when the DaemonSet's pods cannot run on a node with our taint, else None."""
    spec = daemonset.get("spec", {}).get("template", {}).get("spec", {})
    if tolerates_taint(spec.get("tolerations") or [], key, effect):
        return None
    meta = daemonset.get("metadata", {})
    return (f"daemonset {meta.get('namespace')}/{meta.get('name')} does not tolerate the fabric "
            f"taint {key}:{effect} (needs operator: Exists): while the node is tainted the "
            "plugin cannot run, so the node can never recover")
