"""The cyclic collector is held off for a pass and given back after it, whatever the pass
did (run/evaluate.py): a pass that raised must not leave a daemon with no collector."""

from __future__ import annotations

import gc

import pytest

from nodeagent.run.evaluate import _collector_after


def test_the_collector_is_off_in_a_pass_and_back_after_it_even_when_it_raises() -> None:
    assert gc.isenabled()
    with _collector_after():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), _collector_after():
        raise RuntimeError("a pass that failed")
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with _collector_after():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
