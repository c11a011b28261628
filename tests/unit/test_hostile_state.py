"""pins.json as anything a disk, an editor or a bad restore can leave: never a crash, never
a trusted bad pin; a file that is not a pin document is set aside and reported."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.config import Config, parse_config
from nodeagent.state import MAX_GID_INDEX, PINS_FILE, load_pins

RAIL = {"name": "rail0", "interface": "ens1f0", "address": "10.10.0.5/24"}


def cfg_for(state: Path) -> Config:
    return parse_config({"state_dir": str(state), "rails": [RAIL]})


def test_a_good_pin_loads(tmp_path: Path) -> None:
    (tmp_path / PINS_FILE).write_text(json.dumps(
        {"rail0": {"index": 3, "device": "mlx5_0", "port": 1, "address": "10.10.0.5/24"}}))
    got = load_pins(cfg_for(tmp_path))
    assert got.problems == [] and got.pins["rail0"].index == 3


def test_a_negative_index_is_never_trusted(tmp_path: Path) -> None:
    (tmp_path / PINS_FILE).write_text(json.dumps(
        {"rail0": {"index": -7, "device": "mlx5_0", "port": 1, "address": "10.10.0.5/24"}}))
    got = load_pins(cfg_for(tmp_path))
    assert got.pins == {}
    assert got.problems == [f"pin state {tmp_path / PINS_FILE}: malformed pin for rail0 ignored"]


def test_infinity_is_set_aside_by_the_daemon_only(tmp_path: Path) -> None:
    path = tmp_path / PINS_FILE
    path.write_text('{"rail0": {"index": Infinity, "address": "10.10.0.5/24"}}')
    got = load_pins(cfg_for(tmp_path), set_aside=False)  # check: changes nothing
    assert got.pins == {} and path.exists()
    assert got.problems == [f"pin state {path} ignored: Infinity is not a JSON number"]
    got = load_pins(cfg_for(tmp_path))
    assert not path.exists()
    aside = [p.name for p in tmp_path.iterdir()]
    assert len(aside) == 1 and aside[0].startswith(f"{PINS_FILE}.corrupt-"), aside
    assert got.problems == [f"pin state {path} ignored: Infinity is not a JSON number; "
                            f"set aside as {aside[0]}"]


def test_deep_nesting_and_odd_files(tmp_path: Path) -> None:
    path = tmp_path / PINS_FILE
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in load_pins(cfg_for(tmp_path)).problems[0]
    os.mkfifo(path)
    assert "a FIFO, not a regular file" in load_pins(cfg_for(tmp_path)).problems[0]
    path.write_bytes(b"\xff\xfe{}")
    assert "not utf-8 text" in load_pins(cfg_for(tmp_path)).problems[0]
    path.write_text(" " * (2 << 20))
    assert "larger than" in load_pins(cfg_for(tmp_path)).problems[0]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)
_entry = st.fixed_dictionaries({}, optional={
    "index": st.one_of(st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=5),
                       st.booleans(), st.none()),
    "device": st.one_of(st.none(), st.text(max_size=70), st.integers()),
    "port": st.one_of(st.none(), st.integers(-5, 300), st.text(max_size=3)),
    "address": st.sampled_from(["10.10.0.5/24", "10.10.0.5", None])})


def _check(tmp: Path, text: str | bytes) -> None:
    path = tmp / PINS_FILE
    path.unlink(missing_ok=True)
    for old in tmp.iterdir():
        old.unlink()
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, errors="surrogatepass")
    got = load_pins(cfg_for(tmp))
    for pin in got.pins.values():
        assert 0 <= pin.index <= MAX_GID_INDEX
        assert pin.port is None or 1 <= pin.port <= 255
    assert all("\n" not in p for p in got.problems)


@given(st.dictionaries(st.sampled_from(["rail0", "rail1", "x"]), _entry | _json, max_size=3))
def test_generated_pin_documents(tmp_path_factory: Any, doc: dict[str, Any]) -> None:
    _check(tmp_path_factory.mktemp("pins"), json.dumps(doc))


@given(st.text(max_size=300) | st.binary(max_size=300))
def test_generated_pin_text(tmp_path_factory: Any, text: str | bytes) -> None:
    _check(tmp_path_factory.mktemp("pins"), text)


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"boot_id": 7}', "[" * 5000,
                                  '{"boot_id": "BOOT", "rails": []}',
                                  '{"boot_id": "BOOT", "rails": {"rail0": true, '
                                  '"rail1": 1e300, "nope": 5, "rail0x": "x"}}'])
def test_a_lent_file_of_any_shape_lends_nothing_it_should_not(tmp_path: Path,
                                                               text: str) -> None:
    """lent.json (the rails lent to a pod when the last daemon stopped) is read bounded and
    validated: garbage, another boot, unknown rails, times in the future: nothing lent."""
    from nodeagent.config import parse_config
    from nodeagent.state import LENT_FILE, boot_id, load_lent

    cfg = parse_config({"state_dir": str(tmp_path), "rails": [
        {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"},
        {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24"}]})
    (tmp_path / LENT_FILE).write_text(text.replace("BOOT", boot_id(Path("/proc"))))
    assert load_lent(cfg) == {}
    good = {"boot_id": boot_id(Path("/proc")), "rails": {"rail1": 1000.5}}
    (tmp_path / LENT_FILE).write_text(json.dumps(good))
    assert load_lent(cfg) == {"rail1": 1000.5}
