"""Signed bundles from Python: keys, sign_bundle, verify_bundle, and what is refused."""

import datetime

import pytest

import cubridge


@pytest.fixture(scope="module")
def keys():
    return cubridge.generate_keypair()


def test_sign_and_verify_a_cubin(images, keys):
    cubin = images["cubin"].read_bytes()
    bundle = cubridge.sign_bundle(cubin, keys.secret_key, name="filters", version=3,
                                  target="sm_90")
    verified = cubridge.verify_bundle(bundle, [keys.public_key])
    m = verified.manifest
    assert (m.name, m.version, m.target, m.kind) == ("filters", 3, "sm_90", "cubin")
    assert m.payload_size == len(cubin) and len(m.payload_sha256) == 64
    assert m.key_id == keys.public_key.id and m.expires is None
    assert verified.version == 3
    assert verified.payload == cubin
    assert verified.image.find_kernel("mixed_parameters").parameter_sizes == [8, 4, 1, 8, 24]


def test_cuda_source_bundle_has_no_image(keys):
    source = b'extern "C" __global__ void k() {}'
    bundle = cubridge.sign_bundle(source, keys.secret_key, name="k", version=1, target="sm_90",
                                  kind="cuda_source")
    verified = cubridge.verify_bundle(bundle, [keys.public_key])
    assert verified.manifest.kind == "cuda_source" and verified.image is None


def test_tampered_bundle_is_refused(images, keys):
    signed = cubridge.sign_bundle(images["cubin"].read_bytes(), keys.secret_key,
                                  name="filters", version=1, target="sm_90")
    in_payload = bytearray(signed)
    in_payload[len(signed) // 2] ^= 0x01  # the payload follows the short manifest
    with pytest.raises(cubridge.BundleError) as caught:
        cubridge.verify_bundle(bytes(in_payload), [keys.public_key])
    e = caught.value
    assert e.reason == "payload_mismatch"
    assert e.name == "CUBRIDGE_BAD_BUNDLE" and e.layer == "update" and e.code == 1
    in_signature = bytearray(signed)
    in_signature[-1] ^= 0x01  # the signature ends the bundle
    with pytest.raises(cubridge.BundleError) as caught:
        cubridge.verify_bundle(bytes(in_signature), [keys.public_key])
    assert caught.value.reason == "bad_signature"


def test_unknown_key_and_garbage(images, keys):
    bundle = cubridge.sign_bundle(images["cubin"].read_bytes(), keys.secret_key, name="f",
                                  version=1, target="sm_90")
    other = cubridge.generate_keypair()
    with pytest.raises(cubridge.BundleError) as caught:
        cubridge.verify_bundle(bundle, [other.public_key])
    assert caught.value.reason == "unknown_key"
    with pytest.raises(cubridge.BundleError) as caught:
        cubridge.verify_bundle(b"garbage", [keys.public_key])
    assert caught.value.reason in ("too_large", "bad_magic", "malformed")


def test_expiry(images, keys):
    created = datetime.datetime(2030, 1, 1, 12, 0, 0)
    bundle = cubridge.sign_bundle(images["cubin"].read_bytes(), keys.secret_key, name="f",
                                  version=1, target="sm_90", created=created,
                                  expires=created + datetime.timedelta(hours=1))
    ok = cubridge.verify_bundle(bundle, [keys.public_key], require_expiry=True,
                                now=created + datetime.timedelta(minutes=5))
    assert ok.manifest.expires is not None
    with pytest.raises(cubridge.BundleError) as caught:
        cubridge.verify_bundle(bundle, [keys.public_key], now=created + datetime.timedelta(hours=2))
    assert caught.value.reason == "expired"


def test_invalid_manifest_input(keys):
    with pytest.raises(cubridge.BundleError) as caught:
        cubridge.sign_bundle(b"x", keys.secret_key, name="a/b", version=1, target="sm_90")
    assert caught.value.reason == "invalid_manifest"
    with pytest.raises(cubridge.PreconditionError):
        cubridge.sign_bundle(b"x", keys.secret_key, name="a", version=1, target="sm_90",
                             kind="elf")


def test_key_text_round_trip(keys):
    public = cubridge.PublicKey.from_text(keys.public_key.to_text())
    assert public == keys.public_key and len(public.bytes) == 32
    secret = cubridge.SecretKey.from_text(keys.secret_key.to_text())
    assert secret.public_key == keys.public_key
    with pytest.raises(cubridge.BundleError) as caught:
        cubridge.PublicKey.from_text("cubridge-ed25519-public nothex")
    assert caught.value.reason == "bad_key"
