"""Learned GID pins, kept in the state directory so a restart keeps them.

The file is the agent's own, but a disk error, an editor or a bad restore can still leave
anything in it. So it is read bounded and validated entry by entry; a file that is not a pin
document at all is set aside (renamed with a `.corrupt-<time>` suffix, so nothing is lost
and the next save starts clean) and reported, never trusted, never a crash. A pin that could
not be saved is saved again on every pass until it lands.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.config import Config
from nodeagent.io.files import (
    STATE_MAX,
    NotARegularFile,
    TooLarge,
    describe_error,
    parse_json_state,
    read_text_bounded,
    write_json_atomic,
)
from nodeagent.model.kube import DeviceRef, Lending
from nodeagent.model.rdma import Pin

log = logging.getLogger(__name__)
PINS_FILE = "pins.json"
MAX_GID_INDEX = 65535
_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _pin(item: Any) -> Pin | None:
    """One entry, or None when any field is out of shape."""
    if not isinstance(item, dict):
        return None
    index, device, port = item.get("index"), item.get("device"), item.get("port")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_GID_INDEX:
        return None
    if device is not None and (not isinstance(device, str) or not _DEVICE.match(device)):
        return None
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 1 <= port <= 255):
        return None
    return Pin(index=index, device=device, port=port, learned=True)


@dataclass
class PinLoad:
    pins: dict[str, Pin] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # one line each, for `errors`


def load_pins(cfg: Config, set_aside: bool = True) -> PinLoad:
    """Learned pins of the configured rails; a pin learned for another address is dropped,
    a malformed one ignored and reported. With `set_aside` (the daemon and apply; never
    check) a file that is not a pin document is renamed out of the way."""
    path = cfg.state_dir / PINS_FILE
    out = PinLoad()
    try:
        raw = parse_json_state(read_text_bounded(path, STATE_MAX))
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return out
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        why = describe_error(exc)
        # Bad content is moved out of the way; a file that cannot be read (EIO, EACCES)
        # stays where it is for someone to look at.
        if set_aside and isinstance(exc, ValueError | TooLarge | NotARegularFile):
            aside = path.with_name(f"{PINS_FILE}.corrupt-{int(time.time())}")
            try:
                os.replace(path, aside)
                why += f"; set aside as {aside.name}"
            except OSError as mv:
                why += f"; cannot set it aside: {describe_error(mv)}"
        out.problems.append(f"pin state {path} ignored: {why}")
        log.error("%s", out.problems[-1])
        return out
    rails = {r.name: r for r in cfg.rails}
    for name, item in raw.items():
        rail = rails.get(name)
        if rail is None or not isinstance(item, dict) or item.get("address") != rail.address:
            continue  # another rail's, or learned for another address: learn again
        pin = _pin(item)
        if pin is None:
            out.problems.append(f"pin state {path}: malformed pin for {name} ignored")
            log.warning("%s", out.problems[-1])
            continue
        out.pins[name] = pin
    return out


def save_pins(cfg: Config, pins: dict[str, Pin]) -> None:
    rails = {r.name: r for r in cfg.rails}
    data = {
        name: {
            "index": pin.index,
            "device": pin.device,
            "port": pin.port,
            "address": rails[name].address,
        }
        for name, pin in sorted(pins.items())
        if name in rails
    }
    write_json_atomic(Path(cfg.state_dir) / PINS_FILE, data)


LENT_FILE = "lent.json"


def boot_id(procfs_root: Path) -> str:
    """This boot's id (a reboot gives every netdev back: a lent rail is lent no more)."""
    try:
        return read_text_bounded(procfs_root / "sys/kernel/random/boot_id", 64).strip()
    except (OSError, ValueError):
        return ""


@dataclass(frozen=True)
class LentRecord:
    """What lent.json keeps: each lent rail's wall time since, and where the claims named
    one, its holder and when that holder's pod was seen gone (so a restart in between
    still fails a netdev that never comes back)."""

    rails: dict[str, float] = field(default_factory=dict)
    holders: dict[str, Lending] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)


def _times(value: Any, rails: set[str]) -> dict[str, float]:
    return {name: float(t) for name, t in (value if isinstance(value, dict) else {}).items()
            if name in rails and isinstance(t, int | float) and not isinstance(t, bool)
            and 0 < t <= time.time()}


def _holder(value: Any) -> Lending | None:
    got = value if isinstance(value, dict) else {}
    words = [got.get(k) for k in ("driver", "pool", "device", "pod", "claim")]
    if not all(isinstance(w, str) and 0 < len(w) <= 512 for w in words):
        return None
    driver, pool, device, pod, claim = (str(w) for w in words)
    return Lending(DeviceRef(driver, pool, device), pod, claim)


def load_lent_record(cfg: Config) -> LentRecord:
    """The rails lent to another network namespace when the last daemon stopped, this
    boot only; anything unreadable or from another boot: none."""
    try:
        doc = parse_json_state(read_text_bounded(cfg.state_dir / LENT_FILE, STATE_MAX))
    except (OSError, ValueError):
        return LentRecord()
    if not isinstance(doc, dict) or doc.get("boot_id") != boot_id(cfg.paths.procfs) \
            or not doc.get("boot_id"):
        return LentRecord()
    lent = _times(doc.get("rails"), {r.name for r in cfg.rails})
    named = doc.get("holders")
    holders = {rail: held for rail, value in (named if isinstance(named, dict) else {}).items()
               if rail in lent and (held := _holder(value)) is not None}
    return LentRecord(lent, holders, _times(doc.get("ended"), set(holders)))


def load_lent(cfg: Config) -> dict[str, float]:
    """The rails lent when the last daemon stopped (rail -> wall time since)."""
    return load_lent_record(cfg).rails


def save_lent(cfg: Config, lent: LentRecord) -> None:
    """Raises OSError (the caller logs it: the next change saves again)."""
    holders = {rail: {"driver": h.device.driver, "pool": h.device.pool,
                      "device": h.device.device, "pod": h.pod, "claim": h.claim}
               for rail, h in lent.holders.items()}
    write_json_atomic(cfg.state_dir / LENT_FILE,
                      {"boot_id": boot_id(cfg.paths.procfs), "rails": lent.rails,
                       "holders": holders, "ended": lent.ended})
