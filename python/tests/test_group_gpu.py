"""On a GPU: HotModuleGroup from Python (issue 16): one promote across every member, all or
nothing, launches routed by their stream's context, pinned generations, the update endpoint
serving a group. The members are torch's primary context and two contexts of the same device
(one per device on a node; one GPU here)."""

from __future__ import annotations

import pytest

import cubridge

pytestmark = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")

SOURCE = r"""
extern "C" __global__ void tag(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = VERSION;
}
"""
N = 256


@pytest.fixture()
def contexts(ctx):
    """torch's primary context first."""
    return [ctx] + [cubridge.Context.create(ctx.device) for _ in range(2)]


def build(ctx, version):
    return cubridge.compile_cuda(SOURCE, ctx.device.compute_capability,
                                 defines={"VERSION": str(version)})


def written(torch, kernel, contexts, launch=None):
    """What `tag` writes on each member: launched on a stream of each member's context into a
    torch tensor (the primary's memory, which every context of the device can reach)."""
    out = []
    for ctx in contexts:
        t = torch.zeros(N, device="cuda")
        torch.cuda.synchronize()  # our stream does not wait for torch's: the zeros first
        stream = cubridge.Stream(ctx)
        config = cubridge.LaunchConfig(block=N, stream=stream)
        (launch or kernel.launch)(config, t, N)
        stream.synchronize()
        out.append(int(t[N - 1]))
    return out


def test_promote_and_rollback_switch_every_member(torch, contexts):
    ctx = contexts[0]
    group = cubridge.HotModuleGroup("tags", build(ctx, 1), contexts)
    assert group.size == 3
    tag = group.get_kernel("tag")
    assert written(torch, tag, contexts) == [1, 1, 1]
    assert group.promote(group.stage(build(ctx, 2))) == 2
    assert written(torch, tag, contexts) == [2, 2, 2]
    assert group.serving == {"id": 2, "member_versions": [2, 2, 2]}
    assert group.rollback() == 1
    assert written(torch, tag, contexts) == [1, 1, 1]
    assert group.member_stats(2).promotions == 2
    assert group.member_context(1).handle == contexts[1].handle


def test_a_smoke_test_refusing_on_one_member_stages_nothing(torch, contexts):
    ctx = contexts[0]
    group = cubridge.HotModuleGroup("tags", build(ctx, 1), contexts)
    seen = []

    def smoke_test(staged):
        seen.append(staged)
        if len(seen) == 2:  # one member of the three refuses
            raise RuntimeError("wrong answers on this member")

    with pytest.raises(cubridge.VersionRejected, match="wrong answers on this member"):
        group.stage(build(ctx, 2), smoke_test=smoke_test)
    assert len(seen) == 3
    assert written(torch, group.get_kernel("tag"), contexts) == [1, 1, 1]
    assert group.serving["id"] == 1
    with pytest.raises(cubridge.Error, match="no previous generation"):
        group.rollback()


def test_a_pinned_generation_serves_through_a_promote(torch, contexts):
    ctx = contexts[0]
    group = cubridge.HotModuleGroup("tags", [build(ctx, 1)] * 3, contexts)
    tag = group.get_kernel("tag")
    step = group.pin()
    assert step.id == 1 and step.size == 3
    group.promote(group.stage(build(ctx, 2)))
    assert written(torch, tag, contexts,
                   launch=lambda config, *args: tag.launch_pinned(step, config, *args)) == [1, 1, 1]
    assert written(torch, tag, contexts) == [2, 2, 2]
    with pytest.raises(cubridge.Error, match="PinnedGeneration"):
        tag.launch_pinned(cubridge.LaunchConfig(block=N), 0, N)


def test_a_stream_of_a_context_outside_the_group_is_refused(torch, contexts):
    with pytest.raises(cubridge.Error, match="2 images given for 3 members"):
        cubridge.HotModuleGroup("tags", [build(contexts[0], 1)] * 2, contexts)
    group = cubridge.HotModuleGroup("tags", build(contexts[0], 1), contexts[:2])
    outsider = contexts[2]
    t = torch.zeros(N, device="cuda")
    with pytest.raises(cubridge.Error, match="has no member in"):
        group.get_kernel("tag").launch(
            cubridge.LaunchConfig(block=N, stream=cubridge.Stream(outsider)), t, N)


def test_the_endpoint_pushes_a_signed_version_to_every_member(torch, contexts):
    import urllib.request

    ctx = contexts[0]
    group = cubridge.HotModuleGroup("tags", build(ctx, 1), contexts, label=1)
    keys = cubridge.generate_keypair()
    with cubridge.UpdateEndpoint(group, [keys.public_key], persist_state=False) as endpoint:
        bundle = cubridge.sign_bundle(build(ctx, 2), keys.secret_key, name="tags", version=2,
                                      target=ctx.device.compute_capability)
        request = urllib.request.Request(f"{endpoint.url}/v1/modules/tags", data=bundle,
                                         method="PUT",
                                         headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
    assert written(torch, group.get_kernel("tag"), contexts) == [2, 2, 2]
    assert group.versions["serving"]["label"] == 2
