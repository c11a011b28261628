"""pyverbs, imported whole, once per process, by one thread at a time.

The distro's pyverbs is a set of Cython modules that import one another in a cycle
(`pyverbs.device` imports pd, qp, cq, mr and addr; each of them imports device). Two
threads importing them for the first time at once can deadlock on CPython's per-module
import locks, and CPython breaks that deadlock by handing one thread the other's
half-initialised module: a GID read then fails with "name 'gid_str' is not defined" (seen
once in the lab: a gang preflight opened its rail while its responder answered the previous
pod). The daemon has the same shape: GID reads on worker threads, the peer prober, the
responder. So every first use of pyverbs goes through `load()`.
"""

from __future__ import annotations

import importlib
import threading

# Every pyverbs module the agent uses: imported together, so no later import starts the
# cycle again.
MODULES = ("pyverbs.device", "pyverbs.addr", "pyverbs.pd", "pyverbs.cq", "pyverbs.mr",
           "pyverbs.qp", "pyverbs.wr", "pyverbs.enums")

_lock = threading.Lock()
_loaded = False


def load() -> None:
    """Import pyverbs (at most one thread at a time, until it has worked once). Raises what
    the import raises: ImportError, or whatever a build that does not load raises."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if not _loaded:
            for name in MODULES:
                importlib.import_module(name)
            _loaded = True
