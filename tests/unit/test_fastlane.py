"""What the fast lane answers the loop for a deletion, before any repair runs: whether the
loop must look at it at once (None) or may take it with its burst (examined)."""

from __future__ import annotations

from nodeagent.config import parse_config
from nodeagent.model.network import Deletion, RouteInfo, RuleInfo
from nodeagent.run.fastlane import FastLane

CFG = parse_config({"rails": [{"name": "rail0", "interface": "r0", "address": "10.10.0.5/24",
                               "table": 100, "rule_priority": 1000}]})
RULE_GONE = Deletion("rule", rule=RuleInfo(1000, "10.10.0.5/32", 100))
# One of the kernel's three follow-ups of an address deletion (`ip monitor route address`
# after `ip addr del 10.10.0.5/24 dev r0`: the main table's 10.10.0.0/24, then the local
# table's broadcast and "Deleted local 10.10.0.5 dev r0 table local").
LOCAL_GONE = Deletion("route", route=RouteInfo(255, "10.10.0.5/32", None, 7))


def test_without_a_plan_the_loop_decides() -> None:
    assert FastLane().repair(RULE_GONE) is None


def test_a_deletion_of_nothing_a_planned_rail_owns_is_examined_not_urgent() -> None:
    lane = FastLane()
    lane.aim(CFG, {"rail0": 7}, {"rail0": 5})
    got = lane.repair(LOCAL_GONE)
    assert got is not None and not got.done and not got.errors
    assert lane.made == {}, "nothing ran"


def test_a_rail_with_no_room_left_is_the_loops_to_decide() -> None:
    lane = FastLane()
    lane.aim(CFG, {"rail0": 7}, {"rail0": 1})
    lane.made["rail0"] = 1  # its one repair made, not yet taken by the loop
    assert lane.repair(RULE_GONE) is None
    assert lane.repair(LOCAL_GONE) is not None, "what it does not touch is still examined"
