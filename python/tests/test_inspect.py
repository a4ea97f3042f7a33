"""cubridge.inspect on the project's test kernels, and on what is no image; `python -m cubridge
inspect` on a signed bundle, read, verified and refused."""

import json
import pathlib
import subprocess
import sys

import pytest

import cubridge


def test_cubin_kind_target_and_parameter_sizes(images):
    info = cubridge.inspect(images["cubin"])
    assert info.kind == "cubin"
    assert [(t.kind, t.arch, t.sm) for t in info.targets] == [("cubin", "sm_90", 90)]
    sizes = {k.name: k.parameter_sizes for k in info.kernels}
    assert sizes["empty_kernel"] == []
    assert sizes["mixed_parameters"] == [8, 4, 1, 8, 24]
    assert sizes["fill_u32"] == [8, 4, 8]
    assert info.find_kernel("add_f32").parameter_sizes == [8, 4, 8]
    assert info.find_kernel("no_such_kernel") is None
    assert info.kernels_complete
    assert info.can_run_on("sm_90") and not info.can_run_on("sm_80")


def test_fatbin_targets(images):
    info = cubridge.inspect(str(images["fatbin"]))
    assert info.kind == "fatbin"
    assert sorted(t.arch for t in info.targets) == ["compute_90", "sm_80", "sm_90"]
    ptx = [t for t in info.targets if t.kind == "ptx"]
    assert len(ptx) == 1 and ptx[0].ptx_version is not None
    assert info.find_kernel("mixed_parameters").parameter_sizes == [8, 4, 1, 8, 24]
    assert info.can_run_on("sm_80")


def test_bytes_str_and_path_agree(images):
    path = images["cubin"]
    by_bytes = cubridge.inspect(path.read_bytes())
    by_memoryview = cubridge.inspect(memoryview(path.read_bytes()))
    by_str = cubridge.inspect(str(path))
    by_path = cubridge.inspect(pathlib.Path(path))
    names = [[k.name for k in i.kernels] for i in (by_bytes, by_memoryview, by_str, by_path)]
    assert names[0] == names[1] == names[2] == names[3]


def test_garbage_raises_image_error_with_the_cpp_fields():
    with pytest.raises(cubridge.ImageError) as caught:
        cubridge.inspect(b"not an image at all")
    e = caught.value
    assert e.name == "CUBRIDGE_BAD_IMAGE"
    assert e.call == "inspect_image"
    assert e.source == "cubridge" and e.layer == "core"
    assert e.code == 2
    assert "not a cubin, fatbin or PTX image" in str(e)
    assert e.where.endswith(".cpp:" + e.where.rsplit(":", 1)[1])


def test_missing_file_raises_io_failure(tmp_path):
    with pytest.raises(cubridge.IOFailure) as caught:
        cubridge.inspect(tmp_path / "absent.cubin")
    assert caught.value.name == "CUBRIDGE_IO"
    assert "absent.cubin" in str(caught.value)


def test_to_json_is_what_the_tool_prints(images):
    import json
    report = json.loads(cubridge.inspect(images["cubin"]).to_json())
    assert report["kind"] == "cubin"
    assert report["targets"][0]["arch"] == "sm_90"


# test_kernels.cu's scale<float>, a C++ kernel; the others are extern "C".
SCALE = "_Z5scaleIfEvPT_S0_m"
SCALE_DEMANGLED = "void scale<float>(float*, float, unsigned long)"


def test_kernels_have_their_demangled_names(images):
    info = cubridge.inspect(images["cubin"])
    assert info.find_kernel(SCALE).demangled == SCALE_DEMANGLED
    assert info.find_kernel("fill_u32").demangled is None
    kernels = {k["name"]: k for k in json.loads(info.to_json())["kernels"]}
    assert kernels[SCALE]["demangled"] == SCALE_DEMANGLED
    assert kernels["fill_u32"]["demangled"] is None


def inspect_command(*args):
    return subprocess.run([sys.executable, "-m", "cubridge", "inspect", *args],
                          capture_output=True, text=True, check=False)


@pytest.fixture
def signed(images, tmp_path):
    """A bundle of the test cubin under a name that says nothing of it, and two public key files:
    its signer's and another's."""
    signer, other = cubridge.generate_keypair(), cubridge.generate_keypair()
    bundle = cubridge.sign_bundle(images["cubin"].read_bytes(), signer.secret_key,
                                  name="filters", version=3, target="sm_90")
    (tmp_path / "filters.bin").write_bytes(bundle)
    (tmp_path / "right.pub").write_text(signer.public_key.to_text())
    (tmp_path / "wrong.pub").write_text(other.public_key.to_text())
    return tmp_path, signer.public_key.id


def test_inspect_reads_a_bundle_without_verifying_it(signed):
    folder, key_id = signed
    result = inspect_command(str(folder / "filters.bin"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"{folder / 'filters.bin'}: bundle\n")
    assert "  name:      filters\n  version:   3\n  target:    sm_90\n" in out
    assert f"  signer:    key {key_id}\n" in out
    assert "  signature: not verified (pass --key FILE to verify)\n" in out
    assert f"  kernel  {SCALE}(8 B, 4 B, 8 B)  {SCALE_DEMANGLED}\n" in out


def test_inspect_verifies_a_bundle_with_the_right_key(signed):
    folder, key_id = signed
    result = inspect_command(str(folder / "filters.bin"), "--key", str(folder / "wrong.pub"),
                             "--key", str(folder / "right.pub"), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["bundle"]["verified"] is True and report["bundle"]["signer"] == key_id
    assert report["bundle"]["name"] == "filters" and report["kind"] == "cubin"
    text = inspect_command(str(folder / "filters.bin"), "--key", str(folder / "right.pub"))
    assert f"  signature: verified by {key_id}\n" in text.stdout


def test_inspect_refuses_a_bundle_with_a_wrong_key_or_truncated(signed):
    folder, _ = signed
    wrong = inspect_command(str(folder / "filters.bin"), "--key", str(folder / "wrong.pub"))
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert "unknown_key" in wrong.stderr and "filters.bin" in wrong.stderr
    bundle = (folder / "filters.bin").read_bytes()
    (folder / "cut.cubin").write_bytes(bundle[:len(bundle) // 2])
    cut = inspect_command(str(folder / "cut.cubin"))
    assert cut.returncode == 1 and "malformed" in cut.stderr and "truncated" in cut.stderr
