"""What launches check Python arguments against, without a GPU: kernel names and launch shapes."""

import pytest

import cubridge


@pytest.mark.parametrize("mangled, types", [
    ("_Z5scalePffi", ["float*", "float", "int"]),
    ("_Z3addPKfPfyb", ["float const*", "float*", "unsigned long long", "bool"]),
    ("_Z5scaleIfEvPT_S0_i", ["float*", "float", "int"]),  # template: substitutions resolved
    ("_Z1fv", []),
])
def test_a_mangled_name_spells_its_parameter_types(mangled, types):
    assert cubridge.kernel_signature(mangled) == types


@pytest.mark.parametrize("name", ["fill", "_Znot_a_name", ""])
def test_an_extern_c_name_spells_no_types(name):
    assert cubridge.kernel_signature(name) is None


@pytest.mark.parametrize("mangled, plain", [
    ("_Z5scalePffi", "scale"),
    ("_Z5scaleIfEvPT_S0_i", "scale<float>"),
    ("_ZN2ns5scaleEPKfPf", "ns::scale"),
    ("fill", ""),
])
def test_the_unmangled_name_is_what_get_kernel_accepts(mangled, plain):
    assert cubridge.unmangled_name(mangled) == plain


def test_kernels_compiled_from_source_carry_their_types(tmp_path):
    source = """
    extern "C" __global__ void fill(float* x, float v, int n) {}
    template <class T> __global__ void scale(T* x, T a, int n) {}
    template __global__ void scale<float>(float*, float, int);
    __global__ void flags(const double* a, unsigned char c, bool b) {}
    """
    kernels = {k.name: cubridge.kernel_signature(k.name)
               for k in cubridge.inspect(cubridge.compile_cuda(source)).kernels}
    assert kernels["fill"] is None
    assert kernels["_Z5scaleIfEvPT_S0_i"] == ["float*", "float", "int"]
    assert kernels["_Z5flagsPKdhb"] == ["double const*", "unsigned char", "bool"]


def test_a_launch_config_takes_ints_or_tuples_and_resolves_its_stream_once():
    config = cubridge.LaunchConfig(grid=(4, 2), block=256, shared_mem=1024)
    assert config.grid == (4, 2, 1)
    assert config.block == (256, 1, 1)
    assert config.shared_mem == 1024
    assert config.stream is None
    assert "stream 0x0" in repr(config)

    class ForeignStream:  # what cuda.core's and torch's streams offer
        def __cuda_stream__(self):
            return (0, 0x1234)

    foreign = ForeignStream()
    assert "stream 0x1234" in repr(cubridge.LaunchConfig(stream=foreign))
    assert cubridge.LaunchConfig(stream=foreign).stream is foreign

    class TorchLikeStream:
        cuda_stream = 0x99

    assert "stream 0x99" in repr(cubridge.LaunchConfig(stream=TorchLikeStream()))
    assert "stream 0x7" in repr(cubridge.LaunchConfig(stream=7))


@pytest.mark.parametrize("kwargs, message", [
    ({"stream": "default"}, "a str is no stream"),
    ({"grid": (1, 2, 3, 4)}, "grid must be an int or a tuple of 1 to 3 ints"),
    ({"block": ()}, "block must be an int or a tuple of 1 to 3 ints"),
])
def test_a_bad_launch_config_is_refused_with_what_was_wrong(kwargs, message):
    with pytest.raises(cubridge.PreconditionError, match=message):
        cubridge.LaunchConfig(**kwargs)


def test_before_stream_destroy_refuses_the_default_streams():
    for default in (None, 1, 2):  # 1, 2: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
        with pytest.raises(cubridge.PreconditionError, match="not a default stream"):
            cubridge.before_stream_destroy(default)
    cubridge.before_stream_destroy(0x1234)  # no hot module noted it: nothing to fence
