#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>

#include <cstring>

namespace cubridge {
namespace {
std::string name_device(CUdevice d) {
  return "device " + std::to_string(static_cast<int>(d));
}
}  // namespace

int device::count() {
  int n = 0;
  CUBRIDGE_CU(cuDeviceGetCount, (&n), "counting devices");
  return n;
}

device device::get(int ordinal) {
  CUdevice d{};
  CUBRIDGE_CU(cuDeviceGet, (&d, ordinal), "device ordinal " + std::to_string(ordinal));
  return device(d);
}

std::string device::name() const {
  char buffer[256] = {};
  CUBRIDGE_CU(cuDeviceGetName, (buffer, sizeof buffer - 1, handle_), name_device(handle_));
  return buffer;
}

int device::attribute(CUdevice_attribute which) const {
  int value = 0;
  CUBRIDGE_CU(
      cuDeviceGetAttribute, (&value, which, handle_),
      "attribute " + std::to_string(static_cast<int>(which)) + " of " + name_device(handle_));
  return value;
}

compute_capability device::capability() const {
  return {attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
          attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)};
}

std::size_t device::total_memory() const {
  std::size_t bytes = 0;
  CUBRIDGE_CU(cuDeviceTotalMem, (&bytes, handle_), name_device(handle_));
  return bytes;
}

int device::multiprocessor_count() const {
  return attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
}

std::array<unsigned char, 16> device::uuid() const {
  CUuuid raw{};
  CUBRIDGE_CU(cuDeviceGetUuid, (&raw, handle_), name_device(handle_));
  std::array<unsigned char, 16> out{};
  std::memcpy(out.data(), raw.bytes, out.size());
  return out;
}

primary_context_state device::primary_state() const {
  unsigned flags = 0;
  int active = 0;
  CUBRIDGE_CU(cuDevicePrimaryCtxGetState, (handle_, &flags, &active),
              "primary context of " + name_device(handle_));
  return {active != 0, flags};
}

}  // namespace cubridge
