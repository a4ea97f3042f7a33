"""One update gate per node, shared by its doors (UpdateEndpoint and FleetAgent), as in C++.

Without a GPU: a gate serving no module yet still decides (signatures, replays), and a door built
over it decides with it; the old constructors still build a private gate.
"""

from __future__ import annotations

import inspect

import pytest

import cubridge
from endpoint_support import put

KERNEL = b'extern "C" __global__ void tag(int* out) { out[threadIdx.x] = 2; }'




@pytest.fixture(scope="module")
def keys():
    return cubridge.generate_keypair()


def signed(keys, version: int, name: str = "tagger") -> bytes:
    return cubridge.sign_bundle(KERNEL, keys.secret_key, name=name, version=version,
                                target="sm_90", kind="cuda_source")


def test_the_gate_class_is_exported_and_documented():
    assert "UpdateGate" in cubridge.__all__
    for name, member in vars(cubridge.UpdateGate).items():
        if not name.startswith("_"):
            assert inspect.getdoc(member), f"UpdateGate.{name} has no docstring"


def test_a_module_is_added_with_the_nodes_probation_policy_or_none(keys):
    gate = cubridge.UpdateGate([], [keys.public_key], persist_state=False)
    assert "probation" in gate.add.__doc__
    with pytest.raises(cubridge.PreconditionError, match="is no HotModule"):
        gate.add(object(), probation=cubridge.ProbationPolicy(required_launches=4))
    with pytest.raises(TypeError):
        gate.add(object(), probation="bitwise")  # a ProbationPolicy or None
    assert gate.hot_modules == []


def test_a_gate_decides_in_the_gates_words(keys):
    gate = cubridge.UpdateGate([], [keys.public_key], persist_state=False)
    assert gate.hot_modules == [] and gate.serving("tagger") == 0
    gate.start()
    assert gate.started and gate.state_file == ""
    decision = gate.push(signed(keys, 2))
    assert decision["outcome"] == "refused" and decision["reason"] == "unknown_module"
    assert decision["module"] == "tagger" and decision["version"] == 2
    stranger = cubridge.generate_keypair()
    decision = gate.push(signed(stranger, 2))
    assert decision["reason"] == "unknown_key"
    decision = gate.push(signed(keys, 2, name="tagger"), "other")
    assert decision["reason"] == "name_mismatch"


def test_an_endpoint_over_a_shared_gate_decides_with_it(keys):
    gate = cubridge.UpdateGate([], [keys.public_key], persist_state=False)
    with cubridge.UpdateEndpoint(gate=gate) as endpoint:
        assert endpoint.gate is gate
        assert endpoint.hot_modules == []
        status, answer = put(endpoint, "tagger", signed(keys, 2))
        assert (status, answer["error"]) == (404, "unknown_module")
        assert gate.started, "the endpoint started its gate"
    # A second door on the same gate: one replay state, one lock per module.
    second = cubridge.UpdateEndpoint(gate=gate)
    assert second.gate is gate
    second.stop()


def test_a_door_takes_a_gate_or_modules_and_keys_never_both(keys):
    gate = cubridge.UpdateGate([], [keys.public_key], persist_state=False)
    with pytest.raises(cubridge.PreconditionError, match="not both"):
        cubridge.UpdateEndpoint([], [keys.public_key], gate=gate)
    with pytest.raises(cubridge.PreconditionError, match="belong to the gate"):
        cubridge.UpdateEndpoint(gate=gate, persist_state=False)
    with pytest.raises(cubridge.PreconditionError, match="needs hot_modules and public_keys"):
        cubridge.UpdateEndpoint()
    with pytest.raises(cubridge.PreconditionError, match="takes an UpdateGate"):
        cubridge.UpdateEndpoint(gate=42)


def test_the_old_constructor_builds_a_private_gate(keys):
    with cubridge.UpdateEndpoint([], [keys.public_key], persist_state=False) as endpoint:
        assert isinstance(endpoint.gate, cubridge.UpdateGate)
        assert endpoint.gate.started


@pytest.mark.skipif(not cubridge.has_fleet, reason="built without the fleet layer")
def test_a_fleet_agent_and_an_endpoint_share_one_gate(keys, tmp_path):
    gate = cubridge.UpdateGate([], [keys.public_key], persist_state=False)
    node_key = tmp_path / "node.key"
    node_key.write_text("unused: the agent is not started")
    agent = cubridge.FleetAgent(gate=gate, node="node-1", node_key_file=str(node_key),
                                start=False)
    endpoint = cubridge.UpdateEndpoint(gate=gate, start=False)
    assert agent.gate is gate and endpoint.gate is gate
    assert agent.hot_modules == endpoint.hot_modules == []
    with pytest.raises(cubridge.PreconditionError, match="not both"):
        cubridge.FleetAgent([], [keys.public_key], gate=gate, node="node-1",
                            node_key_file=str(node_key), start=False)
