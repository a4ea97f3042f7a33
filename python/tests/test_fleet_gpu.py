"""On a GPU: a Python service as fleet nodes. Three FleetAgents (n1..n3) over HotModules in this
process, each with a Python health probe over the service's own output check of the requests it
serves; a FleetController in Python rolls v2 through waves, then v3, which passes its smoke test
and gives wrong answers on 1% of requests: the first wave catches it within its bake and rolls
it back, and the nodes of later waves never run it."""

from __future__ import annotations

import collections
import threading
import time

import pytest

import cubridge
import fleet_support

pytestmark = [
    pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here"),
    pytest.mark.skipif(not cubridge.has_fleet, reason="built without the fleet layer (libnats)"),
]

MODULE = "tagger"
# out = 2 * in, except that v3 is off by one on 1% of requests (those whose in[0] ends in 07);
# version[0] says which version ran.
KERNEL = r"""
extern "C" __global__ void tag(float* out, const float* in, int* version, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  bool wrong = VERSION == 3 && static_cast<int>(in[0]) % 100 == 7;
  if (i < n) out[i] = 2.0f * in[i] + (wrong ? 1.0f : 0.0f);
  if (i == 0) version[0] = VERSION;
}
"""
N = 1024


def _eventually(condition, what: str) -> None:
    fleet_support.eventually(condition, timeout=30.0, what=what)


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    torch.zeros(1, device="cuda")
    return torch


class Service:
    """The service's traffic: each node's kernel launched in turn on one thread, every answer
    checked; wrong answers and requests counted per node and version (the version the kernel
    says ran)."""

    def __init__(self, torch, nodes: dict[str, cubridge.HotModule]) -> None:
        self.torch = torch
        self.kernels = {node: hot.get_kernel("tag") for node, hot in nodes.items()}
        self.requests: collections.Counter = collections.Counter()
        self.wrong: collections.Counter = collections.Counter()
        self.probes: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        torch = self.torch
        inputs = {node: torch.arange(N, device="cuda", dtype=torch.float32)
                  for node in self.kernels}
        out = torch.empty(N, device="cuda", dtype=torch.float32)
        version = torch.zeros(1, device="cuda", dtype=torch.int32)
        config = cubridge.LaunchConfig(grid=N // 256, block=256,
                                       stream=torch.cuda.current_stream())
        while self.running:
            for node, kernel in self.kernels.items():
                x = inputs[node]
                kernel.launch(config, out, x, version, N)  # a request is one launch
                ran = int(version.item())
                wrong = bool((out != 2 * x).any().item())
                x += 1  # the node's next request
                with self.lock:
                    self.requests[node, ran] += 1
                    self.wrong[node, ran] += wrong

    def probe_for(self, node: str):
        """The node's health probe: its output check over the version serving."""
        def probe(module: str, version: int):
            assert module == MODULE
            with self.lock:
                self.probes[node] += 1
                wrong = self.wrong[node, version]
            return {"healthy": wrong == 0, "values": {"wrong_answers": float(wrong)},
                    "detail": f"output check: {wrong} wrong answers on v{version}"}
        return probe

    def stop(self) -> None:
        self.running = False
        self.thread.join(30)


def _enrolled_agent(control, operator, node: str, hot, probe, servers: str, folder,
                    **options) -> cubridge.FleetAgent:
    """A FleetAgent for `node` over `hot` with `probe`, its key enrolled by the operator."""
    keys = cubridge.generate_keypair()
    key_file = fleet_support.write_secret(folder / f"{node}.key", keys.secret_key)
    control.enroll(node, keys.public_key, operator_key=operator.secret_key)
    return cubridge.FleetAgent(hot, [operator.public_key], node=node, node_key_file=str(key_file),
                               servers=servers, health_probe=probe, persist_state=False, **options)


@pytest.fixture
def fleet(torch, nats_server, tmp_path):
    ctx = cubridge.PrimaryContext.adopt_runtime()
    arch = ctx.device.compute_capability
    operator = cubridge.generate_keypair()
    control = cubridge.FleetController(nats_server, operator_keys=[operator.public_key])

    def bundle(version: int) -> bytes:
        cubin = cubridge.compile_cuda(KERNEL, arch, defines={"VERSION": str(version)})
        return cubridge.sign_bundle(cubin, operator.secret_key, name=MODULE, version=version,
                                    target=arch)

    modules = {f"n{i}": cubridge.HotModule(MODULE, cubridge.compile_cuda(
        KERNEL, arch, defines={"VERSION": "1"}), ctx, label=1) for i in (1, 2, 3)}
    service = Service(torch, modules)
    agents = [_enrolled_agent(control, operator, node, hot, service.probe_for(node), nats_server,
                              tmp_path, heartbeat_interval_s=0.5)
              for node, hot in modules.items()]
    assert control.publish(bundle(1), operator.secret_key)["completed"]
    service.thread.start()

    def healthy_on(version: int) -> bool:
        seen = control.nodes()
        return len(seen) == 3 and all(
            n["live"] and n["heartbeat"]["health"].get(MODULE, {}).get("version") == version
            for n in seen)

    _eventually(lambda: healthy_on(1), what="every node's heartbeat with v1's health")
    try:
        yield control, operator, agents, modules, service, bundle, healthy_on
    finally:
        for agent in agents:
            agent.stop()
        service.stop()
        control.close()


def test_waves_carry_v2_to_every_node_and_v3s_wrong_answers_halt_it_in_the_first_wave(fleet):
    control, operator, agents, modules, service, bundle, healthy_on = fleet
    report = control.rollout_waves(bundle(2), operator.secret_key, waves=["1", "50%"], bake_s=2,
                                   max_metrics={"wrong_answers": 0}, poll_s=0.1)
    assert report["completed"], report["halt_reason"]
    _eventually(lambda: all(h.versions["serving"]["label"] == 2 for h in modules.values()),
                what="every node serving v2")
    _eventually(lambda: healthy_on(2), what="every heartbeat on v2")

    report = control.rollout_waves(bundle(3), operator.secret_key, waves=["1", "50%"], bake_s=10,
                                   max_metrics={"wrong_answers": 0}, poll_s=0.1)
    assert not report["completed"]
    assert report["halt_node"] == "n1"
    assert report["halt_signal"] in ("probe", "metric:wrong_answers"), report["halt_reason"]
    applied = next(e["time"] for e in report["timeline"] if e["what"] == "applied")
    halted = next(e["time"] for e in report["timeline"] if e["what"] == "halted")
    assert halted - applied < 10, "caught within the bake"
    _eventually(lambda: modules["n1"].versions["serving"]["label"] == 2, what="n1 back on v2")
    time.sleep(0.5)  # requests served after the rollback
    with service.lock:
        assert service.wrong["n1", 3] > 0, "v3 served on n1 and gave wrong answers"
        assert service.requests["n2", 3] == 0 and service.requests["n3", 3] == 0
        wrong_elsewhere = sum(w for (node, v), w in service.wrong.items() if v != 3)
        assert wrong_elsewhere == 0, "no wrong answer outside v3's"
        assert all(service.probes[n] > 0 for n in modules)
    desired = control.desired(MODULE)
    assert desired["phase"] == "halted" and desired["stable"]["version"] == 2
    for agent in agents:
        assert agent.running and agent.connected
        assert agent.stats["heartbeats"] > 0
    assert agents[0].stats["applied"] >= 3  # v2, v3, and v2 again


def test_a_probe_that_raises_or_answers_nonsense_reads_unhealthy_with_why(torch, nats_server,
                                                                          tmp_path):
    ctx = cubridge.PrimaryContext.adopt_runtime()
    operator = cubridge.generate_keypair()
    control = cubridge.FleetController(nats_server, operator_keys=[operator.public_key])
    answers = {"raises": None, "nonsense": None, "fine": None}

    def raising(module, version):
        raise ValueError(f"boom on v{version}")

    probes = {"raises": raising, "nonsense": lambda m, v: "yes",
              "fine": lambda m, v: {"healthy": True, "values": {"p99_us": 41.5}}}
    v1 = cubridge.compile_cuda(KERNEL, ctx.device.compute_capability, defines={"VERSION": "1"})
    agents = [_enrolled_agent(control, operator, node, cubridge.HotModule(MODULE, v1, ctx, label=1),
                              probe, nats_server, tmp_path, modules=[MODULE],
                              heartbeat_interval_s=0.2)
              for node, probe in probes.items()]

    def read() -> bool:
        for n in control.nodes():
            if n["heartbeat"] and MODULE in n["heartbeat"]["health"]:
                answers[n["node"]] = n["heartbeat"]["health"][MODULE]
        return all(answers.values())

    try:
        _eventually(read, what="a heartbeat of every node")
    finally:
        for agent in agents:
            agent.stop()
    assert not answers["raises"]["healthy"]
    assert "ValueError: boom on v1" in answers["raises"]["detail"]
    assert not answers["nonsense"]["healthy"]
    assert "returned a str" in answers["nonsense"]["detail"]
    assert answers["fine"]["healthy"] and answers["fine"]["values"] == {"p99_us": 41.5}
    control.close()
