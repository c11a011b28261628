"""The daemon speaks sd_notify to a real notify socket (as systemd would hold it): READY=1
only after the first full pass, STATUS= kept current, WATCHDOG=1 only while the main loop
runs, STOPPING=1 on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.helpers import Netns, daemon_log, read_status, stop_daemon, write_config


class NotifySocket:
    """The receiving end of NOTIFY_SOCKET, as systemd makes it: AF_UNIX datagrams."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[tuple[float, dict[str, str]]] = []

    def receive(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096).decode()
        except TimeoutError:
            return None
        fields = dict(line.split("=", 1) for line in data.splitlines() if "=" in line)
        self.messages.append((time.monotonic(), fields))
        return fields

    def wait_for(self, key: str, timeout: float, value: str | None = None) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.receive(max(0.01, deadline - time.monotonic()))
            if got and key in got and (value is None or got[key].startswith(value)):
                return got
        raise AssertionError(f"no {key}{'=' + value if value else ''} within {timeout}s; "
                             f"got {[m for _, m in self.messages]}")


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    try:
        yield sock
    finally:
        sock.sock.close()


def test_ready_status_watchdog_stopping(rails_ns: Netns, agent_config: dict[str, Any],
                                       tmp_path: Path, notify: NotifySocket) -> None:
    config = write_config(tmp_path / "c.yaml", agent_config)
    proc = rails_ns.start_daemon(config, env={"NOTIFY_SOCKET": str(notify.path),
                                              "WATCHDOG_USEC": "1000000"})
    try:
        ready = notify.wait_for("READY", timeout=20)
        assert ready["READY"] == "1"
        assert ready["STATUS"] == "fabric ready: 2 rail(s), every condition True"
        status = read_status(Path(agent_config["runtime_dir"]))
        assert status is not None and status["daemon"]["passes"] >= 1, \
            "READY only after the first full pass"
        # Pings while the loop runs (no event, no resync due: it wakes to ping).
        notify.wait_for("WATCHDOG", timeout=2)
        notify.wait_for("WATCHDOG", timeout=2)
        # A wedged agent (here: stopped) sends nothing: systemd would kill it.
        os.kill(proc.pid, signal.SIGSTOP)
        children = [int(p) for p in os.popen(f"pgrep -P {proc.pid}").read().split()]
        for child in children:
            os.kill(child, signal.SIGSTOP)
        time.sleep(0.3)  # a ping already in flight
        notify.messages.clear()
        assert notify.receive(2.0) is None, notify.messages
        for pid in [*children, proc.pid]:
            os.kill(pid, signal.SIGCONT)
        notify.wait_for("WATCHDOG", timeout=3)
        # The status line follows the fabric.
        rails_ns.ip("link", "set", "p0", "down")
        got = notify.wait_for("STATUS", timeout=10, value="FABRIC NOT READY")
        assert "NoCarrier" in got["STATUS"]
        code, log = stop_daemon(proc)
        assert code == 0, log
        notify.wait_for("STOPPING", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in daemon_log(proc)


def test_without_systemd_nothing_is_sent(rails_ns: Netns, agent_config: dict[str, Any],
                                         tmp_path: Path, notify: NotifySocket) -> None:
    config = write_config(tmp_path / "c.yaml", agent_config)
    env = {k: "" for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    proc = rails_ns.start_daemon(config, env=env)
    try:
        deadline = time.monotonic() + 20
        while read_status(Path(agent_config["runtime_dir"])) is None:
            assert time.monotonic() < deadline and proc.poll() is None, daemon_log(proc)
            time.sleep(0.1)
        assert notify.receive(1.0) is None
    finally:
        stop_daemon(proc)


def test_without_systemd_python_the_agent_speaks_sd_notify_itself(
        rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path,
        notify: NotifySocket) -> None:
    """A pip-only install has no systemd module: READY=1 still reaches the unit's socket
    (here the module is hidden by one that fails to import, first on the path)."""
    hidden = tmp_path / "hide" / "systemd"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    config = write_config(tmp_path / "c.yaml", agent_config)
    proc = rails_ns.start_daemon(config, env={"NOTIFY_SOCKET": str(notify.path),
                                              "PYTHONPATH": str(hidden.parent)})
    try:
        ready = notify.wait_for("READY", timeout=20)
        assert ready["STATUS"] == "fabric ready: 2 rail(s), every condition True"
        code, log = stop_daemon(proc)
        assert code == 0, log
        notify.wait_for("STOPPING", timeout=5)
        assert "sd_notify over $NOTIFY_SOCKET directly" in log
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sd_notify_to_an_abstract_socket() -> None:
    from nodeagent.io.systemd import SocketNotify

    name = f"nodeagent-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert SocketNotify("@" + name).notify("READY=1\nSTATUS=ok")
        assert sock.recv(4096) == b"READY=1\nSTATUS=ok"
    assert not SocketNotify("@" + name).notify("READY=1")  # nobody listens: no crash
