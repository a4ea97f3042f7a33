"""The fleet from Python, without a GPU: cubridge.FleetController against a real nats-server and
real nodes (the C++ test node, tests/fleet/fleet_node.cpp: a fleet agent over a recording sink),
and what FleetAgent refuses before it touches a GPU. The GPU side (FleetAgent over HotModules
with a Python health probe) is test_fleet_gpu.py."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import time

import pytest

import cubridge
from fleet_support import eventually as _eventually
from fleet_support import write_secret as _write_secret

pytestmark = pytest.mark.skipif(not cubridge.has_fleet,
                                reason="the extension was built without the fleet layer (libnats)")

MODULE = "filters"
SOURCE = b'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'


class Fleet:
    """An operator with a FleetController and nodes n1..nN of the test node, each following
    MODULE and beating every 200 ms; `unhealthy` maps a node to the version its probe fails."""

    def __init__(self, url: str, binary: pathlib.Path, folder: pathlib.Path) -> None:
        self.url, self.binary, self.folder = url, binary, folder
        self.operator = cubridge.generate_keypair()
        (folder / "operator.pub").write_text(self.operator.public_key.to_text())
        self.control = cubridge.FleetController(url, operator_keys=[self.operator.public_key])
        self.processes: dict[str, subprocess.Popen] = {}

    def bundle(self, version: int) -> bytes:
        return cubridge.sign_bundle(SOURCE + f"// v{version}\n".encode(),
                                    self.operator.secret_key, name=MODULE, version=version,
                                    target="sm_90", kind="cuda_source")

    def start(self, count: int, unhealthy: dict[str, int] | None = None) -> None:
        for i in range(1, count + 1):
            node = f"n{i}"
            keys = cubridge.generate_keypair()
            self.control.enroll(node, keys.public_key, operator_key=self.operator.secret_key)
            argv = [str(self.binary), "--server", self.url, "--node", node,
                    "--trusted-key", str(self.folder / "operator.pub"),
                    "--node-key", str(_write_secret(self.folder / f"{node}.key", keys.secret_key)),
                    "--state-file", str(self.folder / f"{node}.state"), "--module", MODULE,
                    "--heartbeat-ms", "200", "--output", str(self.log(node))]
            if unhealthy and node in unhealthy:
                argv += ["--unhealthy-version", str(unhealthy[node])]
            self.processes[node] = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)
        _eventually(lambda: all("ready" in self.events(n) for n in self.processes),
                    what="every node connected")

    def log(self, node: str) -> pathlib.Path:
        return self.folder / f"{node}.events"

    def events(self, node: str) -> str:
        path = self.log(node)
        return path.read_text() if path.exists() else ""

    def offered(self, node: str, version: int) -> bool:
        return f"apply {version}\n" in self.events(node)

    def serving_everywhere(self, version: int) -> bool:
        seen = self.control.nodes()
        return len(seen) == len(self.processes) and all(
            n["live"] and n["heartbeat"] and n["heartbeat"]["versions"].get(MODULE) == version
            for n in seen)

    def on(self, version: int) -> None:
        """Every node serves `version` and the controller has seen it in their heartbeats."""
        report = self.control.publish(self.bundle(version), self.operator.secret_key)
        assert report["completed"]
        _eventually(lambda: self.serving_everywhere(version), what=f"every node on v{version}")

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            process.wait(10)
        self.control.close()


@pytest.fixture
def fleet(nats_server, fleet_node_binary, tmp_path):
    f = Fleet(nats_server, fleet_node_binary, tmp_path)
    try:
        yield f
    finally:
        f.stop()


def _event(report: dict, wave: int, what: str) -> dict:
    found = [e for e in report["timeline"] if e["wave"] == wave and e["what"] == what]
    assert found, f"no '{what}' of wave {wave} in {report['timeline']}"
    return found[0]


def test_waves_pass_after_their_bake_and_every_node_ends_on_the_new_version(fleet):
    fleet.start(4)
    fleet.on(1)
    report = fleet.control.rollout_waves(fleet.bundle(2), fleet.operator.secret_key,
                                         waves=["1", "50%"], bake_s=1.5, poll_s=0.1)
    assert report["completed"], report["halt_reason"]
    assert report["version"] == 2
    assert report["halt_signal"] == ""
    for wave in (0, 1):
        baked = _event(report, wave, "passed")["time"] - _event(report, wave, "applied")["time"]
        assert baked >= 1.5
    assert _event(report, 2, "completed")  # the last wave, every node: the version is stable
    desired = fleet.control.desired(MODULE)
    assert desired["phase"] == "complete" and desired["stable"]["version"] == 2
    _eventually(lambda: fleet.serving_everywhere(2), what="every node on v2")
    # The module's timeline: v1, then the waves of v2, oldest first.
    history = fleet.control.desired_history(MODULE)
    assert history[0]["stable"]["version"] == 1 and history[-1]["stable"]["version"] == 2


def test_a_probe_failing_on_the_canary_halts_the_first_wave_then_resume_and_abort(fleet):
    fleet.start(3, unhealthy={"n1": 2})
    fleet.on(1)
    report = fleet.control.rollout_waves(fleet.bundle(2), fleet.operator.secret_key,
                                         waves=["1", "50%"], bake_s=5, poll_s=0.1)
    assert not report["completed"]
    assert report["halt_signal"] == "probe" and report["halt_node"] == "n1"
    assert report["last_verdict"]["failed"]
    assert "baseline" in report["halt_reason"], report["halt_reason"]
    halted = _event(report, 0, "halted")["time"] - _event(report, 0, "applied")["time"]
    assert halted < 5, "caught within the bake, not at its end"
    desired = fleet.control.desired(MODULE)
    assert desired["phase"] == "halted" and desired["waves"]["halted"]
    assert desired["stable"]["version"] == 1
    # n1 goes back by itself; the nodes of later waves were never offered v2.
    _eventually(lambda: fleet.serving_everywhere(1), what="every node back on v1")
    assert fleet.offered("n1", 2)
    assert not fleet.offered("n2", 2) and not fleet.offered("n3", 2)

    # Resumed while n1 is still unhealthy on v2: the same wave runs again and halts again.
    again = fleet.control.resume(MODULE, fleet.operator.secret_key)
    assert not again["completed"] and again["halt_node"] == "n1"
    assert again["timeline"][0]["wave"] == 0
    aborted = fleet.control.abort(MODULE, fleet.operator.secret_key)
    assert aborted["phase"] == "halted" and "aborted" in aborted["reason"]
    assert "waves" not in aborted or not aborted["waves"]
    with pytest.raises(cubridge.FleetError) as nothing:
        fleet.control.resume(MODULE, fleet.operator.secret_key)
    assert nothing.value.reason == "invalid_state"
    assert not fleet.offered("n2", 2) and not fleet.offered("n3", 2)


def test_wave_policies_that_make_no_sense_are_refused_before_anything_is_written(fleet):
    fleet.start(1)
    fleet.on(1)
    key = fleet.operator.secret_key
    for waves, words in ((["0"], "wave"), (["50%", "10%"], "wave"), (["x"], "wave")):
        with pytest.raises(cubridge.PreconditionError, match=words):
            fleet.control.rollout_waves(fleet.bundle(2), key, waves=waves, bake_s=1)
    for keyword, value in (("bake_s", 0), ("deadline_s", -1), ("poll_s", float("nan")),
                           ("max_failure_rate", 2.0), ("baseline_breach", "sometimes"),
                           ("max_missed_heartbeats", 0)):
        with pytest.raises(cubridge.PreconditionError, match=keyword):
            fleet.control.rollout_waves(fleet.bundle(2), key, waves=["1"], **{keyword: value})
    with pytest.raises(cubridge.PreconditionError, match="max_metrics"):
        fleet.control.rollout_waves(fleet.bundle(2), key, waves=["1"], max_metrics={"a b": 1})
    assert fleet.control.desired(MODULE)["stable"]["version"] == 1
    assert "waves" not in fleet.control.desired(MODULE) or not fleet.control.desired(MODULE)["waves"]
    # The same bundle again is a retry; an older one is the rollback's, and says so.
    assert fleet.control.publish(fleet.bundle(1), key)["already_desired"]
    assert fleet.control.publish(fleet.bundle(2), key)["completed"]
    with pytest.raises(cubridge.FleetError) as older:
        fleet.control.publish(fleet.bundle(1), key)
    assert older.value.reason == "older_version"
    assert older.value.name == "CUBRIDGE_FLEET_OLDER_VERSION"
    back = fleet.control.rollback(MODULE, key)
    assert back["phase"] == "rolled_back" and back["stable"]["version"] == 1


def test_a_controller_that_cannot_reach_the_bus_says_so():
    start = time.monotonic()
    with pytest.raises(cubridge.FleetError) as unreachable:
        cubridge.FleetController("nats://127.0.0.1:1", connect_timeout_s=1)
    assert unreachable.value.reason == "unreachable"
    assert "127.0.0.1:1" in str(unreachable.value)
    assert time.monotonic() - start < 10
    with pytest.raises(cubridge.PreconditionError):
        cubridge.FleetController("http://127.0.0.1:4222")


def test_a_closed_controller_refuses_calls(nats_server):
    control = cubridge.FleetController(nats_server)
    assert control.open_bus
    assert control.nodes() == [] and control.desired(MODULE) is None
    control.close()
    with pytest.raises(cubridge.PreconditionError, match="closed"):
        control.nodes()


def test_an_agent_refuses_what_is_no_hot_module_and_a_node_with_nothing_to_follow(tmp_path):
    keys = cubridge.generate_keypair()
    key_file = _write_secret(tmp_path / "node.key", keys.secret_key)
    with pytest.raises(cubridge.PreconditionError, match="no HotModule"):
        cubridge.FleetAgent([object()], [keys.public_key], node="n1", node_key_file=str(key_file))
    with pytest.raises(cubridge.PreconditionError, match="callable"):
        cubridge.FleetAgent([], [keys.public_key], node="n1", node_key_file=str(key_file),
                            health_probe=3, start=False)
    agent = cubridge.FleetAgent([], [keys.public_key], node="n1", node_key_file=str(key_file),
                                persist_state=False, start=False)
    with pytest.raises(cubridge.PreconditionError):
        agent.start()  # no module to follow
    assert not agent.running
    bad = cubridge.FleetAgent([], [keys.public_key], node="no spaces", node_key_file=str(key_file),
                              modules=["filters"], persist_state=False, start=False)
    with pytest.raises(cubridge.PreconditionError, match="node"):
        bad.start()
    with pytest.raises(cubridge.PreconditionError, match="heartbeat_interval_s"):
        cubridge.FleetAgent([], [keys.public_key], node="n1", node_key_file=str(key_file),
                            heartbeat_interval_s=0, start=False)


def test_a_node_key_others_may_read_is_refused(tmp_path):
    keys = cubridge.generate_keypair()
    key_file = tmp_path / "node.key"
    key_file.write_text(keys.secret_key.to_text())
    os.chmod(key_file, 0o644)
    agent = cubridge.FleetAgent([], [keys.public_key], node="n1", node_key_file=str(key_file),
                                modules=["filters"], persist_state=False, start=False)
    with pytest.raises(cubridge.Error, match="read"):
        agent.start()


# --- the options objects: BusOptions and AgentOptions, as C++'s bus_options and agent options ---

def test_bus_options_hold_the_bus_and_refuse_replicas_outside_one_to_five():
    bus = cubridge.BusOptions()
    assert (bus.servers, bus.credentials, bus.ca_file, bus.api_prefix, bus.replicas) == (
        "nats://127.0.0.1:4222", "", "", "", 1)
    bus = cubridge.BusOptions("tls://nats.example:4222", credentials="operator.creds",
                              ca_file="ca.pem", api_prefix="cubridge.api", replicas=3)
    assert repr(bus) == ("BusOptions(servers='tls://nats.example:4222', "
                         "credentials='operator.creds', ca_file='ca.pem', "
                         "api_prefix='cubridge.api', replicas=3)")
    bus.servers = "nats://user:secret@127.0.0.1:4222"
    bus.credentials = ""
    assert bus.servers == "nats://user:secret@127.0.0.1:4222" and bus.credentials == ""
    assert "secret" not in repr(bus) and "nats://***@127.0.0.1:4222" in repr(bus)
    for replicas in (0, 6, -1):
        with pytest.raises(cubridge.PreconditionError, match="replicas"):
            cubridge.BusOptions(replicas=replicas)
    with pytest.raises(cubridge.PreconditionError, match="replicas"):
        bus.replicas = 6
    assert bus.replicas == 3
    bus.replicas = 5
    assert bus.replicas == 5


def test_agent_options_hold_what_an_agent_runs_with():
    options = cubridge.AgentOptions(node="n1", node_key_file="n1.key")
    assert (options.node, options.node_key_file, options.modules, options.cohort) == (
        "n1", "n1.key", [], "all")
    assert (options.heartbeat_interval_s, options.resync_interval_s) == (5.0, 2.0)
    assert not options.allow_readable_key
    assert repr(options.bus) == repr(cubridge.BusOptions())
    assert repr(options) == (
        "AgentOptions(node='n1', node_key_file='n1.key', bus=" + repr(cubridge.BusOptions()) +
        ", modules=[], cohort='all', heartbeat_interval_s=5.0, resync_interval_s=2.0, "
        "allow_readable_key=False)")

    bus = cubridge.BusOptions("nats://127.0.0.1:4223", replicas=3)
    options = cubridge.AgentOptions(node="n2", node_key_file="n2.key", bus=bus,
                                    modules=["filters"], cohort="eu", heartbeat_interval_s=0.5,
                                    resync_interval_s=1, allow_readable_key=True)
    assert options.bus.servers == "nats://127.0.0.1:4223" and options.bus.replicas == 3
    assert (options.modules, options.cohort) == (["filters"], "eu")
    assert (options.heartbeat_interval_s, options.resync_interval_s) == (0.5, 1.0)
    assert options.allow_readable_key
    bus.replicas = 1
    assert options.bus.replicas == 3, "the options hold a copy of the BusOptions given"
    options.bus.replicas = 2  # the options' own BusOptions
    assert options.bus.replicas == 2
    options.node, options.modules, options.heartbeat_interval_s = "n3", ["a", "b"], 7
    assert (options.node, options.modules, options.heartbeat_interval_s) == ("n3", ["a", "b"], 7.0)
    options.bus = cubridge.BusOptions("nats://127.0.0.1:4224")
    assert options.bus.servers == "nats://127.0.0.1:4224"
    with pytest.raises(TypeError):
        cubridge.AgentOptions(node="n1")  # node_key_file is needed
    with pytest.raises(TypeError):
        cubridge.AgentOptions("n1", "n1.key")  # keywords only


def test_an_agent_built_from_options_runs_with_what_the_keywords_give(tmp_path):
    keys = cubridge.generate_keypair()
    key_file = str(_write_secret(tmp_path / "node.key", keys.secret_key))
    by_keywords = cubridge.FleetAgent([], [keys.public_key], node="n1", node_key_file=key_file,
                                      servers="nats://127.0.0.1:4223", modules=[MODULE],
                                      cohort="eu", heartbeat_interval_s=1, persist_state=False,
                                      start=False)
    options = cubridge.AgentOptions(node="n1", node_key_file=key_file,
                                    bus=cubridge.BusOptions("nats://127.0.0.1:4223"),
                                    modules=[MODULE], cohort="eu", heartbeat_interval_s=1)
    by_options = cubridge.FleetAgent([], [keys.public_key], options=options, persist_state=False,
                                     start=False)
    assert by_options.options.node == by_keywords.options.node == "n1"
    assert repr(by_options.options) == repr(by_keywords.options) == repr(options)
    assert not by_options.running and not by_options.connected
    by_options.options.node = "n9"
    assert by_options.options.node == "n1", "FleetAgent.options is a copy"
    # Defaults read back as AgentOptions' own.
    plain = cubridge.FleetAgent([], [keys.public_key], node="n1", node_key_file=key_file,
                                persist_state=False, start=False)
    assert repr(plain.options) == repr(cubridge.AgentOptions(node="n1", node_key_file=key_file))
    # A shared gate and options, with no keyword of either.
    gate = cubridge.UpdateGate([], [keys.public_key], persist_state=False)
    shared = cubridge.FleetAgent(gate=gate, options=options, start=False)
    assert shared.gate is gate and shared.options.node == "n1"
    # Options are checked when an agent is built with them, as the keywords are.
    options.heartbeat_interval_s = 0
    with pytest.raises(cubridge.PreconditionError, match="heartbeat_interval_s"):
        cubridge.FleetAgent([], [keys.public_key], options=options, start=False)
    options.heartbeat_interval_s = 1
    options.bus.replicas = 3
    assert cubridge.FleetAgent([], [keys.public_key], options=options, persist_state=False,
                               start=False).options.bus.replicas == 3


def test_an_agent_takes_options_or_their_keywords_never_both_and_not_neither(tmp_path):
    keys = cubridge.generate_keypair()
    key_file = str(_write_secret(tmp_path / "node.key", keys.secret_key))
    options = cubridge.AgentOptions(node="n1", node_key_file=key_file)
    both = re.escape("FleetAgent takes node= and node_key_file=, or options=, not both")
    for named in ({"node": "n1"}, {"node_key_file": key_file},
                  {"node": "n1", "node_key_file": key_file}):
        with pytest.raises(cubridge.PreconditionError, match=both):
            cubridge.FleetAgent([], [keys.public_key], options=options, start=False, **named)
    for keyword, value in (("servers", "nats://127.0.0.1:4222"), ("credentials", ""),
                           ("ca_file", ""), ("api_prefix", ""), ("modules", []),
                           ("cohort", "all"), ("heartbeat_interval_s", 5.0),
                           ("resync_interval_s", 2.0), ("allow_readable_key", False)):
        with pytest.raises(cubridge.PreconditionError,
                           match=r"or options= \(an AgentOptions has them\), not both"):
            cubridge.FleetAgent([], [keys.public_key], options=options, start=False,
                                **{keyword: value})
    neither = re.escape("FleetAgent needs node= and node_key_file= (or options=)")
    for named in ({}, {"node": "n1"}, {"node_key_file": key_file}):
        with pytest.raises(cubridge.PreconditionError, match=neither):
            cubridge.FleetAgent([], [keys.public_key], start=False, **named)
    with pytest.raises(TypeError):
        cubridge.FleetAgent([], [keys.public_key], options=cubridge.BusOptions(), start=False)


def test_a_controller_takes_its_bus_as_bus_options(nats_server):
    port = nats_server.rsplit(":", 1)[1]
    with cubridge.FleetController(bus=cubridge.BusOptions(nats_server)) as control:
        assert control.open_bus
        assert control.nodes() == [] and control.desired(MODULE) is None
        assert control.connected_server.endswith(":" + port)
        assert repr(control.bus) == repr(cubridge.BusOptions(nats_server))
    with cubridge.FleetController(nats_server) as by_keywords:
        assert repr(by_keywords.bus) == repr(cubridge.BusOptions(nats_server))


def test_a_controller_takes_bus_options_or_their_keywords_never_both():
    bus = cubridge.BusOptions("nats://127.0.0.1:1")
    with pytest.raises(cubridge.PreconditionError, match="or bus=, not both"):
        cubridge.FleetController("nats://127.0.0.1:1", bus=bus)
    for keyword, value in (("servers", "nats://127.0.0.1:1"), ("credentials", ""),
                           ("ca_file", ""), ("api_prefix", ""), ("replicas", 1)):
        with pytest.raises(cubridge.PreconditionError, match="or bus=, not both"):
            cubridge.FleetController(bus=bus, **{keyword: value})
    with pytest.raises(cubridge.PreconditionError, match="replicas"):
        cubridge.FleetController("nats://127.0.0.1:1", replicas=6)
    with pytest.raises(TypeError):
        cubridge.FleetController(bus="nats://127.0.0.1:1")
