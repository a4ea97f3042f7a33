#pragma once
// The parts of the extension module cubridge._cubridge, one function per file.
#include <nanobind/nanobind.h>

#include <cstddef>
#include <span>

namespace cubridge::python {

/// Python exceptions for cubridge errors (the classes live in cubridge/_errors.py).
void register_errors(nanobind::module_& m);
/// ImageInfo, ImageTarget, ImageKernel, inspect_bytes, inspect_file, render_image.
void bind_images(nanobind::module_& m);
/// PublicKey, SecretKey, KeyPair, BundleManifest, VerifiedBundle and the bundle functions.
void bind_bundles(nanobind::module_& m);

/// The bytes of a Python bytes object, as the C++ API takes them (no copy).
inline std::span<const std::byte> byte_span(const nanobind::bytes& b) {
  return {static_cast<const std::byte*>(b.data()), b.size()};
}
/// A Python bytes object holding a copy of `data`.
inline nanobind::bytes to_bytes(std::span<const std::byte> data) {
  return nanobind::bytes(reinterpret_cast<const char*>(data.data()), data.size());
}

}  // namespace cubridge::python
