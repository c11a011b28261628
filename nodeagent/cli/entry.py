"""The `nodeagent` command: signal dispositions first (nodeagent.io.signals), then the
imports that take a second or more on a busy host."""

from __future__ import annotations

from nodeagent.io.signals import install_early


def main() -> int:
    install_early()
    from nodeagent.cli.main import main as run

    return run()
