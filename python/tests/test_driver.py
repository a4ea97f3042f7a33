"""Without a driver: doctor reports it as a field; device queries raise DriverUnavailable."""

import pytest

import cubridge

no_driver = pytest.mark.skipif(cubridge.driver_available(), reason="a CUDA driver is present")


def test_doctor_is_a_dict_of_the_cpp_report():
    report = cubridge.doctor()
    assert isinstance(report["driver"]["available"], bool)
    assert report["runtime_version"] >= 13000
    assert "CUDA_MODULE_LOADING" in report["environment"]


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
