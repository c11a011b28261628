"""SIGHUP: the config read and validated on a thread of its own.

A config on a filesystem that does not answer must not stop the repairs: the loop goes on
and applies the result when it is delivered (`Reloaded`). One read at a time: a SIGHUP
during a read is queued (one at most), and the file is read again when the read ends, so
the last edit is always the one applied; a read still going after RELOAD_SLOW is said in
the status file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nodeagent.config import Config, ConfigError, DeviceTaints
from nodeagent.run.work import Deliver, NodeChanged, Reloaded

log = logging.getLogger(__name__)

RELOAD_SLOW = 5.0  # a SIGHUP reload still reading the config after this is reported


class ConfigReloader:
    def __init__(self, load: Callable[[], Config], deliver: Deliver) -> None:
        self._load = load
        self._deliver = deliver
        self._loader: threading.Thread | None = None
        self._lock = threading.Lock()
        self._reading = False  # a read is under way (set and cleared under the lock)
        self._again = False  # a SIGHUP came during it: read once more when it ends
        self._started = 0.0
        self.error: str | None = None  # why the last SIGHUP kept the old config

    def _reading_for(self) -> float | None:
        with self._lock:
            return time.monotonic() - self._started if self._reading else None

    def start(self) -> None:
        with self._lock:
            if self._reading:
                self._again = True
                log.info("reload queued: the config is still being read")
                return
            self._reading, self._started = True, time.monotonic()
        self._loader = threading.Thread(target=self._read, name="config-reload", daemon=True)
        self._loader.start()
        # Still reading then: the status file says so without waiting for a pass.
        check = threading.Timer(RELOAD_SLOW + 0.1, lambda: self._deliver(NodeChanged()))
        check.daemon = True
        check.start()

    def _read(self) -> None:
        while True:
            try:
                self._deliver(Reloaded(self._load()))
            except Exception as exc:  # handed to the loop: a failed reload is never a crash
                self._deliver(Reloaded(None, exc))
            with self._lock:
                if not self._again:
                    self._reading = False
                    return
                self._again, self._started = False, time.monotonic()

    def accepted(self, got: Reloaded, running: Config) -> Config | None:
        """The config a finished read brought, or None (logged, and kept as the error).
        Refused too: a config with no rails when rails run now (an emptied or truncated file
        would have the agent let go of every rail), and one that moves the runtime
        directory (its lock stays where the daemon took it)."""
        if got.cfg is not None and got.error is None:
            refused = _not_at_a_reload(got.cfg, running)
            if refused:
                log.error("reload rejected, keeping the last good config: %s", refused)
                self.error = refused
                return None
        exc = got.error
        if isinstance(exc, ConfigError):
            for line in exc.problems:
                log.error("reload rejected, keeping the last good config: %s", line)
            self.error = "; ".join(exc.problems)[:1000]
            return None
        if exc is not None or got.cfg is None:  # anything else the loader met: no crash
            log.error("reload rejected, keeping the last good config: %s: %s",
                      type(exc).__name__, exc)
            self.error = f"{type(exc).__name__}: {exc}"[:1000]
            return None
        return got.cfg

    def not_applied(self, err: Exception) -> None:
        log.error("reload could not be applied, keeping the last good config: %s: %s",
                  type(err).__name__, err)
        self.error = f"cannot apply: {type(err).__name__}: {err}"[:1000]

    def applied(self, cfg: Config, previous: Config) -> None:
        later = [name for name in ("kubernetes", "metrics")
                 if getattr(cfg, name) != getattr(previous, name)]
        if _device_taints(cfg) != _device_taints(previous):  # the publisher's, made at start
            later.append("dra.device_taints")
        # Said in the status file until the next reload: taken, but not all of it yet.
        verb = "take" if len(later) > 1 else "takes"
        self.error = (f"applied, but the {' and '.join(later)} section{'s' * (len(later) > 1)}"
                      f" {verb} effect at a restart" if later else None)
        log.info("config reloaded: %d rail(s)%s", len(cfg.rails),
                 f"; {self.error}" if self.error else "")

    def status_error(self) -> str | None:
        """What the status file says of reloads: the last one's failure, or a read that
        is taking too long."""
        reading = self._reading_for()
        if reading is not None and reading > RELOAD_SLOW:
            queued = "; another SIGHUP waits for it" if self._again else ""
            self.error = f"a reload has been reading the config for {reading:.0f}s{queued}"
        return self.error


def _not_at_a_reload(cfg: Config, running: Config) -> str | None:
    if running.rails and not cfg.rails:
        return (f"the new config names no rails ({len(running.rails)} run now); a config "
                "without rails is taken only at a restart")
    if cfg.runtime_dir != running.runtime_dir:
        return (f"runtime_dir {cfg.runtime_dir} (now {running.runtime_dir}) is taken only at "
                "a restart: the daemon's lock is in the running one")
    return None


def _device_taints(cfg: Config) -> DeviceTaints | None:
    return cfg.dra.device_taints if cfg.dra is not None else None
