"""A node's Consul policy lets it write its own keys and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_sync import keys
from model_sync.cli import main
from model_sync.consul_policy import TEMPLATE, Rule, allowed, render_node_policy, rules
from model_sync.keys import InvalidName

NODE = "edge-a-017"


def policy_of(node: str = NODE) -> list[Rule]:
    return rules(render_node_policy(node, node))


def test_a_node_writes_only_its_own_actual_state() -> None:
    p = policy_of()
    assert allowed(p, "key", keys.actual_key(NODE), "write")
    assert allowed(p, "key", keys.desired_key(NODE), "read")  # watched, never written
    assert not allowed(p, "key", keys.desired_key(NODE), "write")  # the controller's
    for other in ("edge-a-0170", "edge-b-001", "edge-a-01"):
        assert not allowed(p, "key", keys.actual_key(other), "write"), other
        assert not allowed(p, "key", keys.desired_key(other), "write"), other
        assert not allowed(p, "key", keys.desired_key(other), "read"), other
    assert allowed(p, "key", keys.version_key("smollm2", "v2"), "read")
    for key in (
        keys.version_key("smollm2", "v2"),
        "rollouts/smollm2/plan",
        "history/1-x",
        "locks/rollout",
        "nodes/",
    ):
        assert not allowed(p, "key", key, "write"), key
    assert allowed(p, "node", NODE, "write")
    assert not allowed(p, "node", "edge-b-001", "write")
    assert allowed(p, "node", "edge-b-001", "read")  # health listings need it
    assert allowed(p, "agent", NODE, "read")
    assert not allowed(p, "session", "", "write")
    # What Consul cannot narrow (writes go by service name), said in the template.
    assert allowed(p, "service", "hybrid-llm", "write")
    assert "service NAME" in TEMPLATE.read_text()


def test_the_shared_instance_policy_was_the_hole() -> None:
    shared = rules((Path(TEMPLATE).parent / "policy-instance.hcl").read_text())
    assert allowed(shared, "key", keys.desired_key("edge-b-001"), "write")


@pytest.mark.parametrize(
    "node",
    ['x" } key_prefix "" { policy = "write', "a/../b", "../nodes", "", "a b", "x\ny"],
)
def test_names_that_could_add_a_rule_are_refused(node: str) -> None:
    with pytest.raises(InvalidName):
        render_node_policy(node, "edge")
    with pytest.raises(InvalidName):
        render_node_policy("edge", node)


def test_the_cli_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node-policy", NODE, "--consul-node", NODE]) == 0
    out = capsys.readouterr().out
    assert rules(out) == policy_of()
    assert main(["node-policy", "bad/id", "--consul-node", NODE]) == 2
