"""The package imports, exports what it documents, and documents everything it exports."""

import inspect as pyinspect

import pytest

import cubridge


def test_every_public_name_is_exported_and_documented():
    for name in cubridge.__all__:
        item = getattr(cubridge, name)
        assert pyinspect.getdoc(item), f"cubridge.{name} has no docstring"


def test_classes_document_their_properties():
    for cls in (cubridge.ImageInfo, cubridge.ImageTarget, cubridge.ImageKernel,
                cubridge.BundleManifest, cubridge.VerifiedBundle, cubridge.PublicKey,
                cubridge.Device, cubridge.Context, cubridge.PrimaryContext, cubridge.ContextRef,
                cubridge.Stream, cubridge.LaunchConfig, cubridge.Module, cubridge.Kernel,
                cubridge.DeviceView, cubridge.HotModule, cubridge.HotKernel,
                cubridge.HotModuleStats, cubridge.HotReloader, cubridge.StagedModule,
                cubridge.StagedVersion, cubridge.HotModuleGroup, cubridge.GroupKernel,
                cubridge.PinnedGeneration, cubridge.StagedGroup, cubridge.ProbationPolicy):
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                assert pyinspect.getdoc(member), f"{cls.__name__}.{name} has no docstring"


def test_error_classes_share_the_base():
    for name in ("DriverUnavailable", "ImageError", "LaunchArgumentError", "ContextResetError",
                 "VersionRejected", "PreconditionError", "IOFailure", "CompileError",
                 "BundleError", "ProbationError"):
        assert issubclass(getattr(cubridge, name), cubridge.Error)
    assert issubclass(cubridge.PreconditionError, ValueError)
    assert issubclass(cubridge.IOFailure, OSError)


def test_the_stubs_describe_the_launches():
    import pathlib
    stub = (pathlib.Path(cubridge.__file__).parent / "_cubridge.pyi").read_text()
    assert "def launch(self, config: LaunchConfig, /, *args: object) -> None:" in stub
    assert "def launch(self, config: LaunchConfig, /, *args: object) -> int:" in stub


def test_a_group_of_no_contexts_is_refused_before_any_load():
    # Checked before the driver is asked for anything: runs without a GPU too.
    for image in (b"\0" * 16, [b"a", b"b"]):
        with pytest.raises(cubridge.Error, match="needs at least one context"):
            cubridge.HotModuleGroup("g", image, [])


def test_the_version_is_the_projects():
    # The one version (CMakeLists.txt's project()) reaches the extension, the package and its
    # metadata.
    import importlib.metadata
    import re
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", cubridge.__version__)
    assert cubridge.__version__ == cubridge._cubridge.__version__
    assert importlib.metadata.version("cubridge") == cubridge.__version__


def test_the_package_is_typed():
    # PEP 561: without py.typed, type checkers ignore the stubs.
    import pathlib
    assert (pathlib.Path(cubridge.__file__).parent / "py.typed").is_file()
