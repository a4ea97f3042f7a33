"""The update endpoint embedded in a Python process: signed bundles over HTTP into HotModules.

Without a GPU: an endpoint serving no module yet, which still verifies every push (unknown and
bad signatures are refused before any module is looked up). With a GPU: a signed v2 (a cubin,
then CUDA source the endpoint compiles) pushed into a HotModule serving torch launches.
"""

from __future__ import annotations

import inspect
import json
import urllib.request

import pytest

import cubridge
from endpoint_support import put

needs_driver = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")

KERNEL = 'extern "C" __global__ void tag(int* out) { out[threadIdx.x] = VERSION; }'




def modules(endpoint) -> dict:
    with urllib.request.urlopen(f"{endpoint.url}/v1/modules", timeout=60) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def keys():
    return cubridge.generate_keypair()


@pytest.fixture(scope="module")
def stranger():
    return cubridge.generate_keypair()


# --- without a GPU ------------------------------------------------------------------------------

def test_the_endpoint_class_is_exported_and_documented():
    assert "UpdateEndpoint" in cubridge.__all__
    for name, member in vars(cubridge.UpdateEndpoint).items():
        if not name.startswith("_") or name in ("__enter__", "__exit__"):
            assert inspect.getdoc(member), f"UpdateEndpoint.{name} has no docstring"


def test_an_endpoint_starts_on_a_free_port_and_stops(keys):
    endpoint = cubridge.UpdateEndpoint([], [keys.public_key], persist_state=False)
    assert endpoint.running and endpoint.port > 0
    assert endpoint.url == f"http://127.0.0.1:{endpoint.port}"
    assert modules(endpoint)["modules"] == []
    endpoint.stop()
    assert not endpoint.running and endpoint.port == 0 and endpoint.url == ""
    endpoint.stop()  # idempotent
    with endpoint:  # starts again
        assert endpoint.running and endpoint.port > 0
    assert not endpoint.running


def test_start_false_and_starting_twice(keys):
    with cubridge.UpdateEndpoint([], [keys.public_key], start=False,
                                 persist_state=False) as endpoint:
        assert endpoint.running
        with pytest.raises(cubridge.PreconditionError):
            endpoint.start()
    idle = cubridge.UpdateEndpoint([], [keys.public_key], start=False, persist_state=False)
    assert not idle.running and idle.port == 0


def test_pushes_with_unknown_or_bad_signatures_are_refused(keys, stranger):
    source = KERNEL.replace("VERSION", "2").encode()
    with cubridge.UpdateEndpoint([], [keys.public_key], persist_state=False) as endpoint:
        by_stranger = cubridge.sign_bundle(source, stranger.secret_key, name="tagger", version=2,
                                           target="sm_90", kind="cuda_source")
        status, answer = put(endpoint, "tagger", by_stranger)
        assert (status, answer["error"]) == (403, "unknown_key")
        assert stranger.public_key.id in answer["detail"]

        tampered = bytearray(cubridge.sign_bundle(source, keys.secret_key, name="tagger",
                                                  version=2, target="sm_90", kind="cuda_source"))
        tampered[-1] ^= 0x01  # the signature ends the bundle
        status, answer = put(endpoint, "tagger", bytes(tampered))
        assert (status, answer["error"]) == (403, "bad_signature")

        status, answer = put(endpoint, "tagger", b"not a bundle")
        assert status == 400 and answer["error"] == "bad_magic"

        # Signed and valid, but this service has no such module.
        signed = cubridge.sign_bundle(source, keys.secret_key, name="tagger", version=2,
                                      target="sm_90", kind="cuda_source")
        status, answer = put(endpoint, "tagger", signed)
        assert (status, answer["error"]) == (404, "unknown_module")
        stats = endpoint.stats
        assert stats["applied"] == 0 and stats["refused"] == 4


def test_constructor_arguments_are_checked(keys):
    with pytest.raises(cubridge.PreconditionError, match="is no HotModule"):
        cubridge.UpdateEndpoint([42], [keys.public_key], persist_state=False)
    with pytest.raises(TypeError):
        cubridge.UpdateEndpoint(42, [keys.public_key], persist_state=False)
    with pytest.raises(cubridge.PreconditionError, match="rollback_window_s must be > 0"):
        cubridge.UpdateEndpoint([], [keys.public_key], rollback_window_s=0,
                                persist_state=False)
    with pytest.raises(cubridge.IOFailure, match="cannot bind 192.0.2.1"):
        cubridge.UpdateEndpoint([], [keys.public_key], host="192.0.2.1",  # TEST-NET-1: not ours
                                persist_state=False)


def test_the_replay_state_is_persisted_by_default_and_locked(keys, tmp_path, monkeypatch):
    state_dir = tmp_path / "state"
    monkeypatch.setenv("CUBRIDGE_STATE_DIR", str(state_dir))
    endpoint = cubridge.UpdateEndpoint([], [keys.public_key])
    assert (state_dir / "update-state.json.lock").exists()
    # A second service on the same default file would overwrite the first one's records.
    with pytest.raises(cubridge.IOFailure, match="is in use by another process"):
        cubridge.UpdateEndpoint([], [keys.public_key])
    endpoint.stop()
    del endpoint  # the lock is the endpoint's until it is gone
    with cubridge.UpdateEndpoint([], [keys.public_key]) as again:
        assert again.running
    # The explicit opt-out needs no directory at all.
    monkeypatch.delenv("CUBRIDGE_STATE_DIR")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    with cubridge.UpdateEndpoint([], [keys.public_key], persist_state=False) as memory_only:
        assert memory_only.running
    with pytest.raises(cubridge.PreconditionError, match="CUBRIDGE_STATE_DIR"):
        cubridge.UpdateEndpoint([], [keys.public_key])


# --- with a GPU ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch():
    if not cubridge.driver_available():
        pytest.skip("no CUDA driver here")
    torch = pytest.importorskip("torch")
    torch.zeros(1, device="cuda")
    return torch


@needs_driver
def test_a_signed_v2_pushed_over_http_serves_the_next_launch(torch, keys, stranger):
    ctx = cubridge.PrimaryContext.adopt_runtime()
    arch = ctx.device.compute_capability

    def cubin(version):
        return cubridge.compile_cuda(KERNEL, arch, defines={"VERSION": str(version)})

    hot = cubridge.HotModule("tagger", cubin(1), ctx, label=1)
    tag = hot.get_kernel("tag")
    out = torch.zeros(32, device="cuda", dtype=torch.int32)
    config = cubridge.LaunchConfig(block=32, stream=torch.cuda.current_stream())

    def served():
        tag.launch(config, out)
        torch.cuda.synchronize()
        values = set(out.tolist())
        assert len(values) == 1
        return values.pop()

    assert served() == 1
    with cubridge.UpdateEndpoint(hot, [keys.public_key], persist_state=False) as endpoint:
        assert endpoint.hot_modules == [hot]
        refused = cubridge.sign_bundle(cubin(2), stranger.secret_key, name="tagger", version=2,
                                       target=arch)
        assert put(endpoint, "tagger", refused)[0] == 403
        assert served() == 1, "a refused push changes nothing"

        v2 = cubridge.sign_bundle(cubin(2), keys.secret_key, name="tagger", version=2,
                                  target=arch)
        status, answer = put(endpoint, "tagger", v2)
        assert status == 200, answer
        assert answer["promoted"] is True and answer["module"] == "tagger"
        assert (answer["version"], answer["previous_version"]) == (2, 1)
        assert served() == 2
        assert hot.versions["serving"]["label"] == 2

        status, answer = put(endpoint, "tagger", v2)
        assert (status, answer["error"]) == (409, "replayed_version")

        # CUDA C++ source: the endpoint compiles it for this device before staging.
        v3 = cubridge.sign_bundle(KERNEL.replace("VERSION", "3").encode(), keys.secret_key,
                                  name="tagger", version=3, target=arch, kind="cuda_source")
        status, answer = put(endpoint, "tagger", v3)
        assert status == 200, answer
        assert served() == 3
        [module] = modules(endpoint)["modules"]
        assert module["name"] == "tagger" and module["current_version"] == 3
        assert module["versions_held"] == [2, 3]
        stats = endpoint.stats
        assert (stats["applied"], stats["refused"]) == (2, 2)
    assert not endpoint.running
    assert served() == 3, "the HotModule serves on after the endpoint stopped"


@needs_driver
def test_a_version_that_breaks_the_interface_is_refused_and_v1_serves_on(torch, keys):
    ctx = cubridge.PrimaryContext.adopt_runtime()
    arch = ctx.device.compute_capability
    v1 = cubridge.compile_cuda(KERNEL.replace("VERSION", "1"), arch)
    hot = cubridge.HotModule("strict", v1, ctx, label=1)
    renamed = 'extern "C" __global__ void other(int* out) { out[0] = 2; }'
    with cubridge.UpdateEndpoint([hot], [keys.public_key], persist_state=False) as endpoint:
        bundle = cubridge.sign_bundle(cubridge.compile_cuda(renamed, arch), keys.secret_key,
                                      name="strict", version=2, target=arch)
        status, answer = put(endpoint, "strict", bundle)
        assert (status, answer["error"]) == (422, "stage_refused"), answer
        assert hot.versions["serving"]["label"] == 1
        assert hot.stats.rejected == 1
