"""Without a driver: doctor reports it as a field; device queries raise DriverUnavailable."""

import pytest

import cubridge

no_driver = pytest.mark.skipif(cubridge.driver_available(), reason="a CUDA driver is present")


def test_doctor_is_a_dict_of_the_cpp_report():
    report = cubridge.doctor()
    assert isinstance(report["driver"]["available"], bool)
    assert report["runtime_version"] >= 13000
    assert "CUDA_MODULE_LOADING" in report["environment"]


def test_the_package_ships_its_helpers_and_doctor_finds_them_beside_it():
    import pathlib
    package = pathlib.Path(cubridge.__file__).parent
    helpers = cubridge.doctor()["cubridge"]["helpers"]
    for name, file in (("sandbox_worker", "cubridge-sandbox-worker"),
                       ("reset_guard", "libcubridge_reset_guard.so"),
                       ("probation_entry", "libcubridge_probation_entry.so")):
        assert helpers[name]["found"], helpers[name]
        assert pathlib.Path(helpers[name]["path"]) == package / file
        assert helpers[name]["found_by"].startswith("beside ")


def test_the_packaged_reset_guard_guards_a_python_process(reset_guard_library):
    # LD_PRELOAD of the packaged guard: the process knows it is guarded (no GPU needed).
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, LD_PRELOAD=str(reset_guard_library), CUBRIDGE_RESET_POLICY="log")
    code = "import json, cubridge; print(json.dumps(cubridge.doctor()['cubridge']['reset_guard']))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    guard = json.loads(result.stdout)
    assert guard["loaded"] is True
    assert guard["policy"] == "log"


@no_driver
def test_doctor_says_why_there_is_no_driver():
    report = cubridge.doctor()
    assert report["driver"]["available"] is False
    assert "libcuda.so.1" in report["driver"]["reason"]
    assert "devices" not in report


@no_driver
def test_device_query_raises_driver_unavailable_with_the_cpp_fields():
    with pytest.raises(cubridge.DriverUnavailable) as caught:
        cubridge.device_count()
    e = caught.value
    assert isinstance(e, cubridge.Error)
    assert e.name == "CUBRIDGE_NO_DRIVER" and e.code == 1
    assert e.call == "cubridge::driver::api"
    assert "libcuda.so.1" in e.involved
    assert e.source == "cubridge" and e.layer == "core"
    assert e.description == "no usable CUDA driver"
    assert "driver.cpp:" in e.where
