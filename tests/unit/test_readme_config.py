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
    assert cfg.peers is not None and cfg.peers.static["rail0"][1].node == "gpu-07"
    assert cfg.custom_checks is not None and cfg.custom_checks.checks[0].name == "gpu-ecc"
    assert cfg.fabric_traffic is not None and cfg.lustre and cfg.kubernetes is not None


def test_the_readme_architecture_names_every_module() -> None:
    """"How it works" lists the package's modules: a new one cannot go unmentioned."""
    text = README.read_text()
    section = text[text.index("## How it works"):]
    block = re.search(r"```\nnodeagent/\n(.*?)```", section, re.S)
    assert block is not None, "no nodeagent/ tree under ## How it works"
    tree = block.group(1)
    package = README.parent / "nodeagent"
    missing = []
    for module in sorted(package.rglob("*.py")):
        if module.name in ("__init__.py", "__main__.py"):
            continue
        sub = module.parent.relative_to(package).as_posix()
        # A subpackage's modules are named on its line and the lines that continue it.
        entry = re.search(rf"^  {re.escape(sub)}/ (.*?)(?=^  \S|\Z)", tree, re.S | re.M) \
            if sub != "." else re.search(r"(.*)", tree, re.S)
        if entry is None or module.name not in entry.group(1):
            missing.append(str(module.relative_to(package)))
    assert not missing, f"modules not in the README's tree: {missing}"
