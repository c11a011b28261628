"""Learned GID pins, kept in the state directory so a restart keeps them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from nodeagent.config import Config
from nodeagent.fsutil import write_json_atomic
from nodeagent.model import Pin

log = logging.getLogger(__name__)
PINS_FILE = "pins.json"


def load_pins(cfg: Config) -> dict[str, Pin]:
    """Learned pins of the configured rails; a pin learned for another address is dropped."""
    path = cfg.state_dir / PINS_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable pin state %s: %s", path, exc)
        return {}
    pins: dict[str, Pin] = {}
    rails = {r.name: r for r in cfg.rails}
    if not isinstance(raw, dict):
        log.warning("ignoring pin state %s: not a JSON object", path)
        return {}
    for name, item in raw.items():
        rail = rails.get(name)
        if rail is None or not isinstance(item, dict) or item.get("address") != rail.address:
            continue
        try:
            pins[name] = Pin(
                index=int(item["index"]),
                device=item.get("device"),
                port=item.get("port"),
                learned=True,
            )
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring malformed pin for %s in %s", name, path)
    return pins


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
