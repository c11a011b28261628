"""Reading Kubernetes field values from plain API JSON. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any


def obj(value: Any) -> Mapping[str, Any]:
    """A JSON object from someone else's data, or {} when it is anything else."""
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    """A JSON array from someone else's data, or [] when it is anything else."""
    return value if isinstance(value, list) else []


def text(value: Any) -> str:
    """A JSON string from someone else's data, or '' when it is anything else."""
    return value if isinstance(value, str) else ""


def timestamp(text: str | None) -> float | None:
    """An RFC 3339 time (metav1.Time or MicroTime) as Unix seconds; None if absent or bad."""
    if not text or not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def quantity(value: Any) -> int:
    """An extended-resource quantity: plain integers ('8'); anything else counts as 0."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0
