"""pyroute2 without its package's eager imports.

`import pyroute2.<anything>` runs pyroute2/__init__.py first, and that imports every
module the library has (NDB with sqlite3, IPDB, conntrack, ipset, wireguard, nl80211, plan9,
...): 40-90 ms and 6 MB of resident memory here, for a daemon that uses IPRoute and the
rtnetlink message types alone. So the package is registered under its name as a plain
package module with the real package's path: its submodules load on their own (also as
`from pyroute2 import config`, which pyroute2 does itself), and the real __init__ runs,
once, only when another name of the package is asked for (`from pyroute2 import IPRoute`
in a caller that is not the agent).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any


def pyroute2_on_demand() -> None:
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.origin is None or spec.submodule_search_locations is None:
        return  # not installed: the import that needs it says so
    origin = spec.origin
    package = types.ModuleType("pyroute2")
    package.__spec__ = spec
    package.__file__ = origin
    package.__path__ = list(spec.submodule_search_locations)
    package.__package__ = "pyroute2"

    def whole(name: str) -> Any:
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        if importlib.util.find_spec(f"pyroute2.{name}") is not None:
            # `from pyroute2 import config` asks the package first: a submodule, alone
            return importlib.import_module(f"pyroute2.{name}")
        package.__dict__.pop("__getattr__", None)  # once: the real __init__ defines the rest
        with open(origin, encoding="utf-8") as source:
            exec(compile(source.read(), origin, "exec"), package.__dict__)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'pyroute2' has no attribute {name!r}") from None

    package.__dict__["__getattr__"] = whole
    sys.modules["pyroute2"] = package
    import pyroute2.config.log  # noqa: F401  the one side effect of the real __init__: its logger


def _ssl_on_first_use() -> types.ModuleType:
    """A stand-in for `ssl` that imports the real module when one of its names is used."""
    stand_in = types.ModuleType("ssl")

    def real(name: str) -> Any:
        return getattr(importlib.import_module("ssl"), name)

    stand_in.__dict__["__getattr__"] = real
    return stand_in


def iproute_without_ssl() -> None:
    """pyroute2's IPRoute imported without loading ssl (libssl and libcrypto: 2 MB of the
    idle daemon's resident memory, for TLS it never speaks to the kernel).

    pyroute2 0.9 runs its synchronous IPRoute on asyncio, whose modules take ssl when it
    imports and None when it does not (Python built without it: asyncio's own supported
    case, TLS transports refused); and one module of pyroute2 (probe_msg, for its TLS
    probes) imports ssl with no fallback, so it gets a stand-in that loads the real module
    on first use. Afterwards `import ssl` anywhere (the kubernetes client) loads it as
    usual. Called by the commands that open netlink, never on a library import: a process
    that already has ssl, or asyncio, keeps what it has.
    """
    if "ssl" in sys.modules or "asyncio" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment]  # None: "no such module"
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
    sys.modules["ssl"] = _ssl_on_first_use()
    try:
        import pyroute2.iproute.linux  # noqa: F401
    finally:
        del sys.modules["ssl"]
