"""The README's configuration reference is a config the agent accepts, with every optional
section in it: the documentation cannot drift from the schema unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from nodeagent.config import parse_config

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_config_reference_parses_with_every_section() -> None:
    text = README.read_text()
    section = text[text.index("## Configuration"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "no yaml block under ## Configuration"
    cfg = parse_config(yaml.safe_load(block.group(1)))
    assert cfg.device_plugin is not None and cfg.device_plugin.runtime.enabled
    assert cfg.hardware is not None and cfg.hardware.error_limits["symbol_error"] == 10
    assert cfg.transport is not None and cfg.transport.probe_interval == 300
    assert cfg.custom_checks is not None and cfg.custom_checks.checks[0].name == "gpu-ecc"
    assert cfg.fabric_traffic is not None and cfg.lustre and cfg.kubernetes is not None
