"""Signal dispositions for the first moments of the `nodeagent` command, before any heavy
import, and for the signals the agent does not use.

Importing the agent (pydantic, pyroute2, the config schema) takes a second or more on a busy
host, and until the daemon's own handlers are installed a signal would do its default: a
SIGHUP (`systemctl reload` during a start) or SIGUSR1 kills the process, a SIGINT prints a
KeyboardInterrupt traceback from inside an import. So, first of all: SIGINT and SIGTERM end
the process quietly (nothing has been started yet), a SIGHUP is remembered for the daemon
(`take_hup`: it reads the config again once it runs), and the signals the agent does not use
(SIGUSR1, SIGUSR2, SIGALRM) are logged and otherwise ignored for the whole run. Handlers, not
SIG_IGN: a handled signal is reset to its default in the custom checks the agent executes,
an ignored one would stay ignored there.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

UNUSED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
_hup_pending = False


def _quit(signum: int, _frame: FrameType | None) -> None:
    os._exit(128 + signum)  # nothing to clean up yet; no traceback from inside an import


def _hup(_signum: int, _frame: FrameType | None) -> None:
    global _hup_pending
    _hup_pending = True


def _unused(signum: int, _frame: FrameType | None) -> None:
    print(f"nodeagent: ignoring signal {signal.Signals(signum).name} (not used by the agent)",
          file=sys.stderr)


def install_early() -> None:
    signal.signal(signal.SIGINT, _quit)
    signal.signal(signal.SIGTERM, _quit)
    signal.signal(signal.SIGHUP, _hup)
    for signum in UNUSED:
        signal.signal(signum, _unused)


def take_hup() -> bool:
    """Whether a SIGHUP came before the daemon's own handler (and forget it)."""
    global _hup_pending
    pending, _hup_pending = _hup_pending, False
    return pending
