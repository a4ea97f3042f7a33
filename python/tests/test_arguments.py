"""The conversion rules of Kernel.launch, without a GPU: what each Python value becomes for a
parameter of a given C++ type and size (cubridge._cubridge._pack_arguments runs exactly the
launch's conversion and checks, and returns the bytes instead of launching)."""

import gc
import struct
import weakref

import pytest

import cubridge
from cubridge._cubridge import _pack_arguments as pack

SCALE = "_Z5scalePffi"          # scale(float*, float, int)
MIXED = "_Z5mixedPxhbds"        # mixed(long long*, unsigned char, bool, double, short)
UNSIGNED = "_Z1uPjyt"           # u(unsigned int*, unsigned long long, unsigned short)


def test_ints_floats_and_addresses_become_the_parameter_types():
    assert pack(SCALE, [8, 4, 4], 0x1000, 2.5, 7) == [
        struct.pack("<Q", 0x1000), struct.pack("<f", 2.5), struct.pack("<i", 7)]
    assert pack(MIXED, [8, 1, 1, 8, 2], 0, 200, True, 3, -7) == [
        bytes(8), bytes([200]), bytes([1]), struct.pack("<d", 3.0), struct.pack("<h", -7)]


@pytest.mark.parametrize("args, message", [
    ((0, 1.0), "takes 3 parameters, 2 arguments given"),
    ((0, 1.0, 2.5), r"parameter 2 \(int\): a float was given"),
    ((0, 1.0, 2**31), r"parameter 2 \(int\): the int given \(2147483648\) does not fit in 4"),
    ((0, 1.0, -2**31 - 1), r"parameter 2 \(int\): the int given \(-2147483649\) does not fit"),
    ((0, 1.0, 2**70), r"parameter 2 \(int\): the int given does not fit in 4 bytes"),
    ((1.5, 1.0, 1), r"parameter 0 \(float\*\): a float was given"),
    ((-1, 1.0, 1), r"parameter 0 \(float\*\): the int given is not in 0 .. 2\*\*64-1"),
    ((0, "x", 1), r"parameter 1 \(float\): a str was given, which converts to no argument"),
    ((0, None, 1), "a NoneType was given"),
    ((0, True, 1), r"parameter 1 \(float\): a bool was given"),
])
def test_what_does_not_fit_is_refused_naming_the_parameter(args, message):
    with pytest.raises(cubridge.LaunchArgumentError, match=message):
        pack(SCALE, [8, 4, 4], *args)


def test_unsigned_parameters_refuse_negative_ints_and_take_their_whole_range():
    assert pack(UNSIGNED, [8, 8, 2], 0, 2**64 - 1, 65535) == [
        bytes(8), b"\xff" * 8, b"\xff\xff"]
    with pytest.raises(cubridge.LaunchArgumentError, match="negative int for an unsigned"):
        pack(UNSIGNED, [8, 8, 2], 0, 1, -1)
    with pytest.raises(cubridge.LaunchArgumentError, match=r"the int given \(65536\)"):
        pack(UNSIGNED, [8, 8, 2], 0, 1, 65536)


def test_an_extern_c_kernel_is_checked_by_size_alone():
    # fill(float*, float, int) as extern "C": no types in the name, so 4 bytes of float or int.
    assert pack("fill", [8, 4, 4], 16, 1.0, 3) == [
        struct.pack("<Q", 16), struct.pack("<f", 1.0), struct.pack("<i", 3)]
    with pytest.raises(cubridge.LaunchArgumentError, match="is 3 bytes, which no int converts"):
        pack("f", [3], 1)  # a 3-byte struct takes bytes, not an int
    assert pack("f", [3], b"abc") == [b"abc"]
    with pytest.raises(cubridge.LaunchArgumentError, match="is 3 bytes, the bytes given is 2"):
        pack("f", [3], b"ab")


def test_numpy_scalars_pass_their_bytes_and_numpy_arrays_are_refused():
    numpy = pytest.importorskip("numpy")
    assert pack("fill", [8, 4, 4], 0, numpy.float32(0.5), numpy.int32(9)) == [
        bytes(8), struct.pack("<f", 0.5), struct.pack("<i", 9)]
    with pytest.raises(cubridge.LaunchArgumentError, match="is 4 bytes, the numpy.int64 given is 8"):
        pack("fill", [8, 4, 4], 0, 1.0, numpy.int64(9))
    with pytest.raises(cubridge.LaunchArgumentError, match="host memory|host array"):
        pack("fill", [8, 4, 4], numpy.zeros(4, numpy.float32), 1.0, 4)


def test_an_array_interface_passes_its_address_and_a_host_one_is_refused():
    class DeviceArray:  # a __cuda_array_interface__ v3 object with no stream to wait for
        __cuda_array_interface__ = {"data": (0xABC000, False), "shape": (4,),
                                    "typestr": "<f4", "version": 3, "stream": None}

    assert pack(SCALE, [8, 4, 4], DeviceArray(), 1.0, 4)[0] == struct.pack("<Q", 0xABC000)
    with pytest.raises(cubridge.LaunchArgumentError, match=r"parameter 1 \(float\): a device array"):
        pack(SCALE, [8, 4, 4], 0, DeviceArray(), 4)


def _device_array_class(address):
    return type("DeviceArray", (), {"__cuda_array_interface__": {
        "data": (address, False), "shape": (4,), "typestr": "<f4", "version": 3, "stream": None}})


def test_classes_made_per_call_are_not_kept_alive_by_the_launch_path():
    # The launch path remembers each argument type's protocol; a program that makes a class per
    # call must not see them pile up (the cache is bounded), and none outlives the cache's reset.
    cubridge._cubridge._forget_array_protocols()
    alive = []
    for i in range(1000):
        cls = _device_array_class(0x1000 * (i + 1))
        assert pack(SCALE, [8, 4, 4], cls(), 1.0, 4)[0] == struct.pack("<Q", 0x1000 * (i + 1))
        alive.append(weakref.ref(cls))
        del cls
    gc.collect()
    kept = sum(ref() is not None for ref in alive)
    assert 0 < kept <= 256, f"{kept} of 1000 argument classes are still alive"
    cubridge._cubridge._forget_array_protocols()
    gc.collect()
    assert [ref for ref in alive if ref() is not None] == []


class Interface:
    """An object whose __cuda_array_interface__ is whatever the test says."""

    def __init__(self, value):
        self.__cuda_array_interface__ = value


@pytest.mark.parametrize("interface, message", [
    (5, "its __cuda_array_interface__ is a int, not a dict"),
    ({"data": 7}, "'data' is not \\(address, read_only\\)"),
    ({"shape": (1,)}, "'data' is not \\(address, read_only\\)"),
    ({"data": ("0x10", False)}, "'data' is not \\(address, read_only\\)"),
    ({"data": (-5, False)}, "address is not in 0 .. 2\\*\\*64-1"),
    ({"data": (16, False), "stream": "x"}, "'stream' is not None or a stream handle above 0"),
    ({"data": (16, False), "stream": 0}, "'stream' is not None or a stream handle above 0"),
])
def test_a_malformed_array_interface_is_refused_saying_what_is_wrong(interface, message):
    with pytest.raises(cubridge.LaunchArgumentError, match=message):
        pack(SCALE, [8, 4, 4], Interface(interface), 1.0, 1)


def test_what_an_array_interface_or_dlpack_export_raises_propagates():
    class Raises:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("the producer's own error")

    class DLPackRaises:
        def __dlpack__(self, **kwargs):
            raise ValueError("cannot export")

    with pytest.raises(RuntimeError, match="the producer's own error"):
        pack(SCALE, [8, 4, 4], Raises(), 1.0, 1)
    with pytest.raises(cubridge.LaunchArgumentError, match="DLPack export failed"):
        pack(SCALE, [8, 4, 4], DLPackRaises(), 1.0, 1)


def test_a_stream_protocol_that_returns_no_pair_is_refused():
    class Odd:
        def __cuda_stream__(self):
            return 5

    with pytest.raises(cubridge.PreconditionError, match="must return \\(version, handle\\)"):
        cubridge.LaunchConfig(stream=Odd())


@pytest.mark.parametrize("grid", [("a",), -1, 2**40, 1.5, (1, 2, 3, 4), ()])
def test_a_grid_that_is_no_dims_is_refused(grid):
    with pytest.raises(cubridge.PreconditionError, match="grid must be an int or a tuple"):
        cubridge.LaunchConfig(grid=grid)
