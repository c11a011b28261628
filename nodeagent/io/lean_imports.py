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
