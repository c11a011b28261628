"""pyverbs is imported by one thread at a time, whole, once (probes/verbs.py): its Cython
modules import one another in a cycle, and two threads importing them first at once could
each get a half-initialised module ("name 'gid_str' is not defined", seen in the lab)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from nodeagent.probes import verbs


@pytest.fixture
def fresh() -> Iterator[None]:
    loaded = verbs._loaded
    verbs._loaded = False
    try:
        yield
    finally:
        verbs._loaded = loaded


def test_many_threads_at_once_import_one_at_a_time_and_once(
        fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    inside, most, imported = 0, 0, Counter[str]()
    guard = threading.Lock()

    def slow_import(name: str) -> object:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
            imported[name] += 1
        time.sleep(0.002)  # an import long enough for another thread to come in
        with guard:
            inside -= 1
        return object()

    monkeypatch.setattr(verbs.importlib, "import_module", slow_import)
    start = threading.Barrier(8)
    threads = [threading.Thread(target=lambda: (start.wait(), verbs.load())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1
    assert imported == Counter(dict.fromkeys(verbs.MODULES, 1))


def test_a_failed_import_is_raised_and_tried_again(
        fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken(name: str) -> object:
        calls.append(name)
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(verbs.importlib, "import_module", broken)
    for _ in range(2):
        with pytest.raises(ImportError):
            verbs.load()
    assert calls == [verbs.MODULES[0]] * 2


def test_the_distros_pyverbs_loads_whole(fresh: None) -> None:
    """The real modules (tools/bootstrap installs python3-pyverbs): every one the agent
    uses, with the name the lab's error said was missing."""
    verbs.load()
    import pyverbs.device

    assert callable(pyverbs.device.gid_str)
