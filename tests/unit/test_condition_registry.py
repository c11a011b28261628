"""The condition registry is the one list: its entries are well-formed, and everything that
lists condition types (the admission policy, the fleet's columns, the README's table) is
derived from it or checked against it."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from nodeagent.checks.conditions import CONDITION_TYPES, CONDITIONS, judge_all
from nodeagent.checks.facts import Facts
from nodeagent.cli.deploy import render
from nodeagent.cli.fleet import COLUMNS, render_table
from nodeagent.config import Config, parse_config
from nodeagent.model.conditions import FABRIC_READY, ConditionType, Finding

ROOT = Path(__file__).resolve().parents[2]


def test_every_type_is_registered_once_and_every_entry_is_well_formed() -> None:
    assert sorted(CONDITION_TYPES) == sorted(ConditionType), "an enum member not registered"
    assert len(set(CONDITION_TYPES)) == len(CONDITION_TYPES)
    columns = [c.column for c in CONDITIONS]
    assert len(set(columns)) == len(columns), "two conditions share a fleet column"
    fixed = {"NODE", "FABRIC", "REASON", "TAINT", "SINCE", "HEARTBEAT", "RDMA", "PEERS",
             "SWITCHES", "FLAGS"}
    assert not {c.column for c in COLUMNS} & fixed, "a condition column hides a fixed one"
    for c in CONDITIONS:
        if c.section is not None:
            assert c.section in Config.model_fields, f"{c.type}: no config section {c.section}"
        if c.needs_section or c.gate == "section":
            assert c.section is not None, f"{c.type}: configured by which section?"
        if c.gate == "section":
            assert "gate" in Config.model_fields[c.section].annotation.__args__[0].model_fields  # type: ignore[index, union-attr]


@pytest.mark.parametrize("condition", [c for c in CONDITIONS if c.section], ids=str)
def test_each_example_section_parses_and_turns_its_condition_on(condition) -> None:  # type: ignore[no-untyped-def]
    bare = parse_config({})
    cfg = parse_config({condition.section: condition.example})
    assert condition.configured(cfg) and not condition.configured(bare)
    assert condition.enabled(cfg)
    assert condition.enabled(bare) is not condition.needs_section


def test_a_section_gate_decides_fabric_ready_and_core_ones_always_gate() -> None:
    failing = {c.type: Finding(c.type, "False", "Broken", "broken") for c in CONDITIONS}
    for c in CONDITIONS:
        if c.type == FABRIC_READY:
            continue
        judged = replace(c, judge=lambda cfg, f, t=c.type: failing[t])
        for gate in (True, False):
            section = c.example
            if c.gate == "section":
                section = {**c.example, "gate": gate}
            cfg = parse_config({c.section: section} if c.section else {})
            fabric = judge_all(cfg, Facts(now=0.0),
                               (judged, *[x for x in CONDITIONS if x.type == FABRIC_READY]))
            want = gate or c.gate == "always"
            assert (fabric[-1].status == "False") is want, (c.type, gate)


def test_the_admission_policy_allows_exactly_the_registered_types() -> None:
    text = render(parse_config({}))["admission-policy.yaml"]
    policy = next(d for d in yaml.safe_load_all(text)
                  if d and d["kind"] == "ValidatingAdmissionPolicy")
    expression = next(v["expression"] for v in policy["spec"]["variables"]
                      if v["name"] == "conditionTypes")
    assert re.findall(r"'([A-Za-z]+)'", expression) == list(CONDITION_TYPES)


def test_fleet_wide_has_a_column_for_every_registered_condition() -> None:
    head = render_table([], now=0.0, wide=True).split()
    assert head[3:3 + len(COLUMNS)] == [c.column for c in CONDITIONS if c.type != FABRIC_READY]


def readme_conditions() -> dict[str, str]:
    """The README's conditions table: type -> its qualifier ('' or the words in brackets)."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Conditions (True = good)", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        m = re.match(r"\| `([A-Za-z]+)`( \(([^)]*)\))? \|", line)
        assert m, f"README conditions table: a row that names no type: {line[:60]}"
        rows[m.group(1)] = m.group(3) or ""
    return rows


def test_the_readme_table_lists_every_registered_condition_as_registered() -> None:
    rows = readme_conditions()
    assert sorted(rows) == sorted(CONDITION_TYPES), "README conditions table vs the registry"
    for c in CONDITIONS:
        if c.needs_section:
            assert rows[c.type] in (f"with a `{c.section}` section only",
                                    f"with an `{c.section}` section only"), c.type
        else:
            assert "only" not in rows[c.type], c.type
