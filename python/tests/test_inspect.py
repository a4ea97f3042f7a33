"""cubridge.inspect on the project's test kernels, and on what is no image."""

import pathlib

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
