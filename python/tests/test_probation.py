"""Without a GPU: cubridge.ProbationPolicy (the numbers of HotModule.stage(probation=...)) is
built, read back and checked as it is set; ProbationError is a VersionRejected; the package ships
the probation worker's entry library beside its extension."""

import pathlib
import re

import pytest

import cubridge


def test_a_default_policy_has_the_cpp_defaults():
    policy = cubridge.ProbationPolicy()
    assert policy.required_launches == 16
    assert policy.sample_every == 100
    assert policy.max_snapshot_bytes == 64 << 20
    assert policy.deadline_s == 60.0
    assert policy.run_timeout_s == 10.0
    assert policy.default_check == "bitwise"
    assert policy.checks == {}


def test_every_attribute_reads_back_what_was_given():
    checks = {"scale": {"check": "float_tolerance", "absolute": 1e-6, "relative": 1e-5,
                        "ignored_parameters": [2]},
              "histogram": {"check": "fault_only"},
              "walk": {"check": "never_mirror"}}
    policy = cubridge.ProbationPolicy(required_launches=4, sample_every=3,
                                      max_snapshot_bytes=1 << 20, deadline_s=2.5,
                                      run_timeout_s=0.25, default_check="fault_only",
                                      checks=checks)
    assert (policy.required_launches, policy.sample_every, policy.max_snapshot_bytes) == \
        (4, 3, 1 << 20)
    assert (policy.deadline_s, policy.run_timeout_s) == (2.5, 0.25)
    assert policy.default_check == "fault_only"
    # Each entry reads back whole, the keys left out with their defaults.
    assert policy.checks == {
        "scale": {"check": "float_tolerance", "absolute": 1e-6, "relative": 1e-5,
                  "ignored_parameters": [2]},
        "histogram": {"check": "fault_only", "absolute": 0.0, "relative": 0.0,
                      "ignored_parameters": []},
        "walk": {"check": "never_mirror", "absolute": 0.0, "relative": 0.0,
                 "ignored_parameters": []},
    }


def test_attributes_can_be_set_and_read_back():
    policy = cubridge.ProbationPolicy()
    policy.required_launches = 8
    policy.sample_every = 1
    policy.max_snapshot_bytes = 4096
    policy.deadline_s = 30
    policy.run_timeout_s = 1.5
    for name in ("bitwise", "float_tolerance", "fault_only", "never_mirror"):
        policy.default_check = name
        assert policy.default_check == name
    policy.checks = {"scale": {"ignored_parameters": [0, 1]}}
    assert (policy.required_launches, policy.sample_every, policy.max_snapshot_bytes) == \
        (8, 1, 4096)
    assert (policy.deadline_s, policy.run_timeout_s) == (30.0, 1.5)
    assert policy.checks["scale"]["check"] == "bitwise"
    assert policy.checks["scale"]["ignored_parameters"] == [0, 1]
    # The dict read is a copy: changing it changes nothing.
    policy.checks["scale"]["check"] = "fault_only"
    assert policy.checks["scale"]["check"] == "bitwise"
    policy.checks = {}
    assert policy.checks == {}


def test_the_repr_names_every_number():
    text = repr(cubridge.ProbationPolicy(sample_every=7, checks={"k": {"check": "fault_only"}}))
    assert text.startswith("ProbationPolicy(required_launches=16, sample_every=7, ")
    assert "default_check='bitwise'" in text
    assert "'fault_only'" in text


def test_a_check_that_is_no_check_is_refused_with_the_names_there_are():
    names = re.escape("(bitwise, float_tolerance, fault_only, never_mirror)")
    with pytest.raises(cubridge.PreconditionError, match=f"'approximate' is no check {names}"):
        cubridge.ProbationPolicy(default_check="approximate")
    with pytest.raises(cubridge.PreconditionError, match="'Bitwise' is no check"):
        cubridge.ProbationPolicy(checks={"scale": {"check": "Bitwise"}})
    policy = cubridge.ProbationPolicy()
    with pytest.raises(cubridge.PreconditionError, match=r"checks\['scale'\]\['check'\]"):
        policy.checks = {"scale": {"check": "exact"}}
    with pytest.raises(ValueError, match="is no check"):  # a PreconditionError is a ValueError
        policy.default_check = ""
    assert policy.default_check == "bitwise" and policy.checks == {}


def test_a_misspelt_or_misshapen_check_entry_is_refused():
    with pytest.raises(cubridge.PreconditionError, match="has key 'relativ'"):
        cubridge.ProbationPolicy(checks={"scale": {"check": "float_tolerance", "relativ": 1e-5}})
    with pytest.raises(cubridge.PreconditionError, match="must be a dict"):
        cubridge.ProbationPolicy(checks={"scale": "bitwise"})
    with pytest.raises(cubridge.PreconditionError, match="must be a dict"):
        cubridge.ProbationPolicy(checks=["scale"])
    with pytest.raises(cubridge.PreconditionError, match="0 or more"):
        cubridge.ProbationPolicy(checks={"scale": {"absolute": -1.0}})
    with pytest.raises(cubridge.PreconditionError, match="0 or more"):
        cubridge.ProbationPolicy(checks={"scale": {"relative": float("nan")}})


def test_numbers_out_of_range_are_refused():
    for keywords, pattern in (({"required_launches": 0}, "required_launches must be at least 1"),
                              ({"sample_every": 0}, "sample_every must be at least 1"),
                              ({"max_snapshot_bytes": 0}, "max_snapshot_bytes must be at least 1"),
                              ({"deadline_s": 0}, "deadline_s must be positive"),
                              ({"deadline_s": -1.0}, "deadline_s must be positive"),
                              ({"run_timeout_s": float("inf")}, "run_timeout_s must be positive")):
        with pytest.raises(cubridge.PreconditionError, match=pattern):
            cubridge.ProbationPolicy(**keywords)
    policy = cubridge.ProbationPolicy()
    with pytest.raises(cubridge.PreconditionError, match="sample_every must be at least 1"):
        policy.sample_every = 0
    with pytest.raises(cubridge.PreconditionError, match="deadline_s must be positive"):
        policy.deadline_s = float("nan")
    assert (policy.sample_every, policy.deadline_s) == (100, 60.0)
    with pytest.raises(TypeError):
        cubridge.ProbationPolicy(required_launches=-1)
    with pytest.raises(TypeError):
        cubridge.ProbationPolicy(16)  # keywords only


def test_a_probation_error_is_a_version_rejection_with_the_verdict():
    assert issubclass(cubridge.ProbationError, cubridge.VersionRejected)
    e = cubridge.ProbationError("refused", verdict="mismatch_in_probation", kernel="scale",
                                launch=3, parameter=0, offset=148, passed=2, not_mirrorable=1,
                                name="CUBRIDGE_VERSION_REJECTED", layer="swap")
    assert (e.verdict, e.kernel, e.launch, e.parameter, e.offset) == \
        ("mismatch_in_probation", "scale", 3, 0, 148)
    assert (e.passed, e.not_mirrorable, e.name, str(e)) == \
        (2, 1, "CUBRIDGE_VERSION_REJECTED", "refused")


def test_the_package_ships_the_probation_entry_beside_its_extension():
    package = pathlib.Path(cubridge.__file__).parent
    assert (package / "libcubridge_probation_entry.so").is_file()
