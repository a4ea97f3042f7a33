// device_span: a typed view of device memory, usable as T* and as CUdeviceptr. CPU only: the
// span never dereferences its pointer, so host arrays and made-up addresses stand in for device
// memory.
#include <cubridge/core/device_span.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace {

using cubridge::device_span;

// --- compile-time properties -------------------------------------------------------------------

static_assert(std::is_trivially_copyable_v<device_span<float>>,
              "spans pass to kernels and cross threads by value");
static_assert(std::is_nothrow_default_constructible_v<device_span<int>>);
static_assert(std::is_same_v<device_span<const double>::element_type, const double>);

// T -> const T converts implicitly; the reverse does not.
static_assert(std::is_convertible_v<device_span<int>, device_span<const int>>);
static_assert(!std::is_convertible_v<device_span<const int>, device_span<int>>);
static_assert(!std::is_constructible_v<device_span<int>, device_span<const int>>);
// No conversion between unrelated or differently sized element types.
static_assert(!std::is_convertible_v<device_span<int>, device_span<float>>);
static_assert(!std::is_convertible_v<device_span<std::int16_t>, device_span<std::int32_t>>);
// Derived -> base would make pointer arithmetic on the array wrong: refused, as std::span does.
struct base {
  int a;
};
struct derived : base {
  int b;
};
static_assert(!std::is_convertible_v<device_span<derived>, device_span<base>>);

// The implicit T* conversion (for runtime calls and <<<>>> kernels).
static_assert(std::is_convertible_v<device_span<float>, float*>);
static_assert(std::is_convertible_v<device_span<float>, const float*>);
static_assert(std::is_convertible_v<device_span<const float>, const float*>);
static_assert(!std::is_convertible_v<device_span<const float>, float*>);

// Everything but the CUdeviceptr conversions is constexpr.
constexpr std::array<int, 8> constant_array{1, 2, 3, 4, 5, 6, 7, 8};

constexpr bool default_span_is_empty() {
  constexpr device_span<int> s;
  return s.data() == nullptr && s.size() == 0 && s.size_bytes() == 0 && s.empty();
}
static_assert(default_span_is_empty());

constexpr bool constexpr_views() {
  const device_span<const int> all(constant_array.data(), constant_array.size());
  if (all.size() != 8 || all.size_bytes() != 8 * sizeof(int) || all.empty()) return false;
  const auto middle = all.subspan(2, 3);
  if (middle.data() != constant_array.data() + 2 || middle.size() != 3) return false;
  if (middle.size_bytes() != 3 * sizeof(int)) return false;
  const int* as_pointer = middle;  // implicit T* conversion in a constant expression
  if (*as_pointer != 3) return false;
  const auto none = all.subspan(8, 0);
  return none.empty() && none.data() == constant_array.data() + 8;
}
static_assert(constexpr_views());

constexpr bool constexpr_const_conversion() {
  const device_span<const int> c = device_span<const int>(constant_array.data(), 4);
  const device_span<const int> again(c);
  return again.data() == constant_array.data() && again.size() == 4;
}
static_assert(constexpr_const_conversion());

// --- run-time checks ---------------------------------------------------------------------------

TEST(DeviceSpan, DefaultConstructedIsEmpty) {
  const device_span<double> s;
  EXPECT_EQ(s.data(), nullptr);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.size_bytes(), 0u);
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.address(), CUdeviceptr{0});
}

TEST(DeviceSpan, ConstructionKeepsPointerAndSize) {
  std::array<float, 16> storage{};
  const device_span<float> s(storage.data(), storage.size());
  EXPECT_EQ(s.data(), storage.data());
  EXPECT_EQ(s.size(), 16u);
  EXPECT_EQ(s.size_bytes(), 16u * sizeof(float));
  EXPECT_FALSE(s.empty());
}

TEST(DeviceSpan, SizeBytesScalesWithElementSize) {
  struct alignas(16) wide {
    double a, b;
  };
  static_assert(sizeof(wide) == 16);
  std::array<wide, 5> storage{};
  EXPECT_EQ(device_span<wide>(storage.data(), 5).size_bytes(), 80u);
  std::array<std::byte, 5> bytes{};
  EXPECT_EQ(device_span<std::byte>(bytes.data(), 5).size_bytes(), 5u);
}

TEST(DeviceSpan, FromNativeRoundTripsToAddress) {
  // Typical device addresses under unified addressing (never dereferenced here).
  for (const CUdeviceptr address : {CUdeviceptr{0x7f3a00000000ull}, CUdeviceptr{0x302000200ull},
                                    CUdeviceptr{0x10}, CUdeviceptr{0}}) {
    const auto s = device_span<std::uint32_t>::from_native(address, 1024);
    EXPECT_EQ(s.address(), address);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s.data()), static_cast<std::uintptr_t>(address));
    EXPECT_EQ(s.size(), 1024u);
    EXPECT_EQ(s.size_bytes(), 1024u * sizeof(std::uint32_t));
  }
}

TEST(DeviceSpan, AddressAndDataNameTheSameByte) {
  std::array<short, 4> storage{};
  const device_span<short> s(storage.data(), storage.size());
  EXPECT_EQ(s.address(),
            static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(storage.data())));
  // from_native of the address gives back an equal span.
  const auto back = device_span<short>::from_native(s.address(), s.size());
  EXPECT_EQ(back.data(), s.data());
  EXPECT_EQ(back.size(), s.size());
}

TEST(DeviceSpan, SubspanOffsetsDataAndAddress) {
  std::array<double, 10> storage{};
  const device_span<double> all(storage.data(), storage.size());

  const auto tail = all.subspan(4, 6);
  EXPECT_EQ(tail.data(), storage.data() + 4);
  EXPECT_EQ(tail.size(), 6u);
  EXPECT_EQ(tail.address(), all.address() + 4 * sizeof(double));

  const auto head = all.subspan(0, 3);
  EXPECT_EQ(head.data(), storage.data());
  EXPECT_EQ(head.size(), 3u);

  const auto nested = all.subspan(2, 6).subspan(1, 2);
  EXPECT_EQ(nested.data(), storage.data() + 3);
  EXPECT_EQ(nested.size(), 2u);

  const auto empty = all.subspan(10, 0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), storage.data() + 10);
}

TEST(DeviceSpan, SubspanOfFromNativeKeepsByteOffsets) {
  const CUdeviceptr base_address = 0x7f0000100000ull;
  const auto s = device_span<std::uint64_t>::from_native(base_address, 100);
  // Only the address is computed; nothing is read.
  const auto part = s.subspan(10, 20);
  EXPECT_EQ(part.address(), base_address + 10 * sizeof(std::uint64_t));
  EXPECT_EQ(part.size_bytes(), 20 * sizeof(std::uint64_t));
}

TEST(DeviceSpan, ConvertsToConstSpan) {
  std::array<int, 7> storage{};
  const device_span<int> mutable_span(storage.data(), storage.size());
  const device_span<const int> const_span = mutable_span;
  EXPECT_EQ(const_span.data(), storage.data());
  EXPECT_EQ(const_span.size(), 7u);
  EXPECT_EQ(const_span.address(), mutable_span.address());

  // The conversion also happens for function arguments.
  const auto size_of = [](device_span<const int> s) { return s.size(); };
  EXPECT_EQ(size_of(mutable_span), 7u);
}

std::uintptr_t runtime_style_call(const float* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
std::uintptr_t runtime_style_write(float* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

TEST(DeviceSpan, ConvertsImplicitlyToPointer) {
  std::array<float, 3> storage{1.0f, 2.0f, 3.0f};
  const device_span<float> s(storage.data(), storage.size());
  float* p = s;
  EXPECT_EQ(p, storage.data());
  EXPECT_EQ(runtime_style_write(s), reinterpret_cast<std::uintptr_t>(storage.data()));
  EXPECT_EQ(runtime_style_call(s), reinterpret_cast<std::uintptr_t>(storage.data()));
  const device_span<const float> c = s;
  const float* q = c;
  EXPECT_EQ(q, storage.data());

  const device_span<float> none;
  EXPECT_EQ(static_cast<float*>(none), nullptr);
}

TEST(DeviceSpan, CopiesAreIndependentViews) {
  std::array<int, 4> storage{};
  device_span<int> a(storage.data(), 4);
  const device_span<int> b = a;
  a = a.subspan(1, 2);
  EXPECT_EQ(b.data(), storage.data());
  EXPECT_EQ(b.size(), 4u);
  EXPECT_EQ(a.data(), storage.data() + 1);
  EXPECT_EQ(a.size(), 2u);
}

}  // namespace
