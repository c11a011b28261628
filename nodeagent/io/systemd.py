"""systemd integration: readiness, a status line and the watchdog (sd_notify), and logging
to the journal with structured fields. systemd-python (Debian's python3-systemd) does the
protocols when installed; without it (a pip-only install) the agent speaks sd_notify itself:
one datagram per message to $NOTIFY_SOCKET, a path or an abstract name ("@..."), as
sd_notify(3) documents. Outside systemd all of it is a no-op and logs go to stderr."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Any

log = logging.getLogger(__name__)

# Journal fields the agent sets (journalctl -u nodeagent RAIL=rail0 CONDITION=... REASON=...)
RAIL, CONDITION, REASON = "RAIL", "CONDITION", "REASON"


def _daemon() -> Any:
    try:
        from systemd import daemon
    except ImportError:
        return None
    return daemon


class SocketNotify:
    """sd_notify without libsystemd: the same datagrams, sent to the same socket."""

    def __init__(self, address: str) -> None:
        # "@name" is Linux's abstract namespace: a leading NUL byte on the wire.
        self.address = "\0" + address[1:] if address.startswith("@") else address

    def notify(self, text: str) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto(text.encode(), self.address)
            except OSError as exc:
                log.warning("sd_notify to %s: %s", self.address.lstrip("\0"), exc)
                return False
        return True


class Notifier:
    """READY=1 after the first full pass, STATUS= after every pass, WATCHDOG=1 from the
    main loop only (so a wedged loop stops the pings and systemd restarts the agent)."""

    def __init__(self) -> None:
        self.socket = os.environ.get("NOTIFY_SOCKET")
        self.daemon = _daemon() if self.socket else None
        if self.socket and self.daemon is None:
            log.info("systemd-python is not installed: sd_notify over $NOTIFY_SOCKET directly")
            self.daemon = SocketNotify(self.socket)
        usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
        mine = pid is None or pid == str(os.getpid())
        self.watchdog = int(usec) / 1e6 if usec and usec.isdigit() and mine else None
        self._last_status = ""
        self._last_ping = 0.0

    @property
    def ping_every(self) -> float | None:
        """How often the loop must come round to ping: half the watchdog interval."""
        return None if self.watchdog is None else self.watchdog / 2

    def _send(self, text: str) -> None:
        if self.daemon is not None:
            self.daemon.notify(text)

    def ready(self, status: str) -> None:
        self._last_status = status
        self._send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> None:
        if status != self._last_status:
            self._last_status = status
            self._send(f"STATUS={status}")

    def ping(self) -> None:
        now = time.monotonic()
        if self.watchdog is not None and now - self._last_ping >= self.watchdog / 4:
            self._last_ping = now
            self._send("WATCHDOG=1")

    def stopping(self) -> None:
        self._send("STOPPING=1\nSTATUS=stopping")


def under_journal() -> bool:
    """Whether stderr is connected to the journal (systemd sets JOURNAL_STREAM=dev:inode)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def setup_logging(level: str) -> None:
    if under_journal():
        try:
            from systemd.journal import JournalHandler
        except ImportError:
            pass
        else:
            handler = JournalHandler(SYSLOG_IDENTIFIER="nodeagent")
            handler.setFormatter(logging.Formatter("%(message)s"))
            logging.basicConfig(level=level, handlers=[handler])
            return
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="nodeagent %(levelname)s %(name)s: %(message)s")
