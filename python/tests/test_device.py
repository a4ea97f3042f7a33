"""With a driver (the GPU machine): the devices as the C++ library sees them."""

import pytest

import cubridge

needs_driver = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")


@needs_driver
def test_device_count_and_doctor_agree_on_the_devices():
    count = cubridge.device_count()
    assert count >= 1
    report = cubridge.doctor()
    assert report["driver"]["available"] is True
    assert len(report["devices"]) == count
    for device in report["devices"]:
        assert device["arch"].startswith("sm_")
        assert device["multiprocessors"] > 0
