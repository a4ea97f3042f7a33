// Python values to kernel arguments, streams and contexts. The launch path: every launch from
// Python converts its arguments here, so the common cases (torch and CuPy tensors, ints,
// floats) take a few attribute reads and no allocation; what a type is gets worked out once per
// type and remembered.
#include "bindings.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

[[noreturn]] void refuse_argument(const launch_signature& s, std::size_t index,
                                  const std::string& why) {
  std::string type;
  if (index < s.types.size() && !s.types[index].spelling.empty())
    type = " (" + s.types[index].spelling + ")";
  detail::throw_errc(
      errc::bad_launch_arguments, "Kernel.launch",
      "kernel '" + s.kernel_name + "' parameter " + std::to_string(index) + type + ": " + why);
}

/// How a Python type hands over a device address; worked out once per type.
enum class array_protocol { none, torch, cupy, cuda_array_interface, dlpack };

bool type_has(PyTypeObject* t, const char* attribute) {
  return PyObject_HasAttrString(reinterpret_cast<PyObject*>(t), attribute) == 1;
}

/// The protocol of each type seen, worked out once per type. The cache owns a reference to each
/// type (a freed type's address could be reused by another), so it is bounded: a program that
/// makes a class per call must not grow it without end. Emptied at interpreter exit (atexit), so
/// it keeps no user class, nor what such a class refers to, alive past the interpreter.
class protocol_cache {
 public:
  static constexpr std::size_t capacity = 256;
  [[nodiscard]] static protocol_cache& instance() {
    static protocol_cache cache;  // the interpreter's GIL guards it
    return cache;
  }
  [[nodiscard]] const array_protocol* find(PyTypeObject* t) const {
    const auto it = known_.find(t);
    return it == known_.end() ? nullptr : &it->second;
  }
  void add(PyTypeObject* t, array_protocol p) {
    if (known_.size() >= capacity) clear();
    Py_INCREF(t);
    known_.emplace(t, p);
  }
  void clear() noexcept {
    for (const auto& [t, p] : known_) Py_DECREF(t);
    known_.clear();
  }

 private:
  protocol_cache() = default;
  std::unordered_map<PyTypeObject*, array_protocol> known_;
};

array_protocol protocol_of(PyTypeObject* t) {
  auto& cache = protocol_cache::instance();
  if (const auto* known = cache.find(t)) return *known;
  const std::string module =
      nb::cast<std::string>(nb::getattr(reinterpret_cast<PyObject*>(t), "__module__", nb::str("")));
  array_protocol p = array_protocol::none;
  if (type_has(t, "data_ptr") && type_has(t, "is_cuda"))
    p = array_protocol::torch;
  else if (module.starts_with("cupy") && type_has(t, "__cuda_array_interface__"))
    p = array_protocol::cupy;
  else if (type_has(t, "__cuda_array_interface__"))
    p = array_protocol::cuda_array_interface;
  else if (type_has(t, "__dlpack__"))
    p = array_protocol::dlpack;
  cache.add(t, p);
  return p;
}

/// A torch tensor's device address, or nothing for a tensor that is not on a CUDA device.
std::optional<std::uintptr_t> torch_address(PyObject* tensor) {
  static PyObject* is_cuda = PyUnicode_InternFromString("is_cuda");
  static PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  const nb::object on_gpu = nb::steal(PyObject_GetAttr(tensor, is_cuda));
  if (!on_gpu.is_valid()) throw nb::python_error();
  if (on_gpu.ptr() != Py_True) return std::nullopt;
  const nb::object address = nb::steal(PyObject_CallMethodNoArgs(tensor, data_ptr));
  if (!address.is_valid()) throw nb::python_error();
  return int_of(address);
}

std::uintptr_t cupy_address(PyObject* array) {
  static PyObject* data = PyUnicode_InternFromString("data");
  static PyObject* ptr = PyUnicode_InternFromString("ptr");
  const nb::object memory = nb::steal(PyObject_GetAttr(array, data));
  if (!memory.is_valid()) throw nb::python_error();
  const nb::object address = nb::steal(PyObject_GetAttr(memory.ptr(), ptr));
  if (!address.is_valid()) throw nb::python_error();
  return int_of(address);
}

/// Makes `consumer` wait for the work queued on `producer` so far, as __cuda_array_interface__
/// v3 asks of a consumer given a stream.
void wait_for(CUstream producer, CUstream consumer) {
  const auto& api = driver::api();
  CUevent e = nullptr;
  CUBRIDGE_CU(cuEventCreate, (&e, CU_EVENT_DISABLE_TIMING),
              "an event ordering a __cuda_array_interface__ array's stream before a launch");
  const CUresult recorded = api.cuEventRecord(e, producer);
  const CUresult waited =
      recorded == CUDA_SUCCESS ? api.cuStreamWaitEvent(consumer, e, 0) : recorded;
  detail::check_release(api.cuEventDestroy(e), "cuEventDestroy");
  if (waited != CUDA_SUCCESS)
    detail::throw_driver_error(waited, "cuStreamWaitEvent",
                               "the launch's stream waiting for a __cuda_array_interface__ "
                               "array's stream",
                               std::source_location::current());
}

/// A __cuda_array_interface__ as read and checked: every field used comes out of here, so a
/// malformed one (not a dict, 'data' not a tuple, an address or stream that is no integer) is
/// refused with what was wrong instead of being read blindly.
struct array_interface {
  nb::dict fields;
  std::uintptr_t address = 0;
  std::optional<std::uintptr_t> stream;  // none: no stream to wait for
};

std::optional<array_interface> read_array_interface(nb::handle array, std::string& why) {
  const nb::object o =
      nb::getattr(array, "__cuda_array_interface__");  // what it raises, propagates
  if (!PyDict_Check(o.ptr())) {
    why = "its __cuda_array_interface__ is a " + type_name(o.ptr()) + ", not a dict";
    return std::nullopt;
  }
  array_interface out{nb::borrow<nb::dict>(o), 0, std::nullopt};
  PyObject* data = PyDict_GetItemString(out.fields.ptr(), "data");  // borrowed
  if (data == nullptr || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 ||
      !PyLong_Check(PyTuple_GET_ITEM(data, 0))) {
    why = "its __cuda_array_interface__'s 'data' is not (address, read_only)";
    return std::nullopt;
  }
  out.address = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
  if (PyErr_Occurred()) {
    PyErr_Clear();
    why = "its __cuda_array_interface__'s address is not in 0 .. 2**64-1";
    return std::nullopt;
  }
  PyObject* stream = PyDict_GetItemString(out.fields.ptr(), "stream");
  if (stream != nullptr && stream != Py_None) {
    const unsigned long long handle =
        PyLong_Check(stream) && !PyBool_Check(stream) ? PyLong_AsUnsignedLongLong(stream) : 0;
    if (PyErr_Occurred()) PyErr_Clear();
    if (handle == 0) {  // v3: 0 is ambiguous and not allowed
      why = "its __cuda_array_interface__'s 'stream' is not None or a stream handle above 0";
      return std::nullopt;
    }
    out.stream = handle;
  }
  return out;
}

std::uintptr_t interface_address(PyObject* array, const launch_config& config,
                                 const launch_signature& s, std::size_t index) {
  std::string why;
  const auto interface = read_array_interface(array, why);
  if (!interface) refuse_argument(s, index, why);
  if (interface->stream) {
    const auto handle = *interface->stream;
    // 1 and 2 are the legacy and the per-thread default streams (the interface's spelling).
    const CUstream producer = handle == 1   ? CU_STREAM_LEGACY
                              : handle == 2 ? CU_STREAM_PER_THREAD
                                            : reinterpret_cast<CUstream>(handle);
    const bool same = producer == config.stream.get() ||
                      (stream_ref::from_native(producer).is_legacy() && config.stream.is_legacy());
    if (!same) wait_for(producer, config.stream.get());
  }
  return interface->address;
}

/// What a DLPack export says of an array's memory (launches and device ranges read it alike).
struct dlpack_memory {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  std::int32_t device_type = 0;  // DLPack's kDL* device type

  /// Memory of a CUDA device (or managed memory), not host memory.
  [[nodiscard]] bool on_device() const noexcept {
    return device_type == nb::device::cuda::value || device_type == nb::device::cuda_managed::value;
  }
};

/// `array`'s memory as its DLPack export gives it, or nullopt when the export fails.
std::optional<dlpack_memory> read_dlpack(nb::handle array) {
  nb::ndarray<> view;
  if (!nb::try_cast(array, view)) return std::nullopt;
  return dlpack_memory{reinterpret_cast<std::uintptr_t>(view.data()), view.nbytes(),
                       view.device_type()};
}

std::uintptr_t dlpack_address(PyObject* array, const launch_signature& s, std::size_t index) {
  const auto memory = read_dlpack(array);
  if (!memory) refuse_argument(s, index, "a " + type_name(array) + " whose DLPack export failed");
  // Pinned host memory is mapped for kernels too: a launch takes it, a device range does not.
  if (!memory->on_device() && memory->device_type != nb::device::cuda_host::value)
    refuse_argument(
        s, index,
        "a " + type_name(array) + " in host memory was given; kernels take device memory");
  return memory->address;
}

/// The device address `arg` stands for, or false when it is no array of any protocol.
bool device_address(PyObject* arg, const launch_config& config, const launch_signature& s,
                    std::size_t index, std::uintptr_t& address) {
  switch (protocol_of(Py_TYPE(arg))) {
    case array_protocol::none:
      return false;
    case array_protocol::torch: {
      const auto on_gpu = torch_address(arg);
      if (!on_gpu)
        refuse_argument(s, index,
                        "a torch tensor on the CPU was given; kernels take device memory (move "
                        "it with .cuda())");
      address = *on_gpu;
      return true;
    }
    case array_protocol::cupy:
      address = cupy_address(arg);
      return true;
    case array_protocol::cuda_array_interface:
      address = interface_address(arg, config, s, index);
      return true;
    case array_protocol::dlpack:
      address = dlpack_address(arg, s, index);
      return true;
  }
  return false;
}

template <class T>
void push_integer(kernel_arguments& out, long long value, const launch_signature& s,
                  std::size_t index) {
  if (!std::in_range<T>(value))
    refuse_argument(s, index,
                    "the int given (" + std::to_string(value) + ") does not fit in " +
                        std::to_string(sizeof(T)) + (sizeof(T) == 1 ? " byte" : " bytes"));
  out.push(static_cast<T>(value));
}

void push_int(kernel_arguments& out, PyObject* arg, const launch_signature& s, std::size_t index,
              parameter_kind kind, std::size_t size) {
  if (kind == parameter_kind::floating) {  // as C++ converts an int argument to a float one
    const double v = PyLong_AsDouble(arg);
    if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();
    if (size == 4) return out.push(static_cast<float>(v));
    return out.push(v);
  }
  if (kind == parameter_kind::half || kind == parameter_kind::boolean)
    refuse_argument(s, index,
                    "an int was given (pass a " +
                        std::string(kind == parameter_kind::half ? "numpy.float16" : "bool") + ")");
  const bool is_unsigned = kind == parameter_kind::unsigned_int || kind == parameter_kind::pointer;
  if (is_unsigned && size == 8) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      refuse_argument(s, index, "the int given is not in 0 .. 2**64-1");
    }
    return out.push(v);
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    refuse_argument(s, index, "the int given does not fit in " + std::to_string(size) + " bytes");
  }
  if (is_unsigned && v < 0) refuse_argument(s, index, "a negative int for an unsigned parameter");
  switch (size) {
    case 1:
      return is_unsigned ? push_integer<std::uint8_t>(out, v, s, index)
                         : push_integer<std::int8_t>(out, v, s, index);
    case 2:
      return is_unsigned ? push_integer<std::uint16_t>(out, v, s, index)
                         : push_integer<std::int16_t>(out, v, s, index);
    case 4:
      return is_unsigned ? push_integer<std::uint32_t>(out, v, s, index)
                         : push_integer<std::int32_t>(out, v, s, index);
    case 8:
      return out.push(v);
    default:
      refuse_argument(s, index,
                      "is " + std::to_string(size) +
                          " bytes, which no int converts to (pass bytes or a numpy "
                          "scalar)");
  }
}

void push_float(kernel_arguments& out, PyObject* arg, const launch_signature& s, std::size_t index,
                parameter_kind kind, std::size_t size) {
  if (kind != parameter_kind::floating && kind != parameter_kind::unknown)
    refuse_argument(s, index, "a float was given");
  const double v = PyFloat_AS_DOUBLE(arg);
  if (size == 4) return out.push(static_cast<float>(v));
  if (size == 8) return out.push(v);
  refuse_argument(s, index, "is " + std::to_string(size) + " bytes, a float was given");
}

/// numpy scalars, ctypes values and bytes: their bytes, which must be the parameter's size.
bool push_buffer(kernel_arguments& out, PyObject* arg, const launch_signature& s, std::size_t index,
                 parameter_kind kind, std::size_t size) {
  if (!PyObject_CheckBuffer(arg)) return false;
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE | PyBUF_ND) != 0) {
    PyErr_Clear();
    return false;
  }
  const bool scalar = view.ndim == 0 || PyBytes_Check(arg) || PyByteArray_Check(arg);
  const auto bytes = static_cast<std::size_t>(view.len);
  std::string why;
  if (!scalar)
    why = "a host array (" + type_name(arg) +
          ") was given; kernels take device memory (pass a torch or CuPy tensor)";
  else if (kind == parameter_kind::pointer)
    why = "a " + type_name(arg) + " value was given for a pointer";
  else if (bytes != size)
    why = "is " + std::to_string(size) + " bytes, the " + type_name(arg) + " given is " +
          std::to_string(bytes) + " bytes";
  if (why.empty())
    out.push(view.buf, bytes, bytes >= 16 ? 16 : (bytes >= 8 ? 8 : (bytes >= 4 ? 4 : 1)));
  PyBuffer_Release(&view);
  if (!why.empty()) refuse_argument(s, index, why);
  return true;
}

void convert_one(const launch_signature& s, std::size_t index, PyObject* arg,
                 const launch_config& config, kernel_arguments& out) {
  const std::size_t size = s.parameters[index].size;
  const parameter_kind kind = s.types.empty() ? parameter_kind::unknown : s.types[index].kind;
  if (PyBool_Check(arg)) {
    if (kind != parameter_kind::boolean && !(kind == parameter_kind::unknown && size == 1))
      refuse_argument(s, index, "a bool was given");
    return out.push(static_cast<std::uint8_t>(arg == Py_True ? 1 : 0));
  }
  if (PyLong_Check(arg)) return push_int(out, arg, s, index, kind, size);
  if (PyFloat_Check(arg)) return push_float(out, arg, s, index, kind, size);
  std::uintptr_t address = 0;
  bool is_array = device_address(arg, config, s, index, address);
  if (!is_array) {
    if (push_buffer(out, arg, s, index, kind, size)) return;
    // An interface set on the object rather than its type (a wrapper's own attribute): looked
    // for only here, off the path of the types that declare one.
    if (PyObject_HasAttrString(arg, "__cuda_array_interface__") == 1) {
      address = interface_address(arg, config, s, index);
      is_array = true;
    }
  }
  if (!is_array)
    refuse_argument(s, index, "a " + type_name(arg) + " was given, which converts to no argument");
  if (kind != parameter_kind::pointer && (kind != parameter_kind::unknown || size != 8))
    refuse_argument(s, index, "a device array (" + type_name(arg) + ") was given");
  out.push(address);
}

[[noreturn]] void refuse_range(const std::string& what, const std::string& why) {
  detail::throw_errc(errc::precondition, "cubridge", what + ": " + why);
}

std::size_t size_of(nb::handle h) {
  return nb::cast<std::size_t>(h);
}

/// The bytes a __cuda_array_interface__ spans: its shape times the item size, or with strides
/// the distance from the first to the last element's end.
device_range interface_range(nb::handle array, const std::string& what) {
  std::string why;
  const auto interface = read_array_interface(array, why);
  if (!interface) refuse_range(what, why);
  const nb::dict& fields = interface->fields;
  if (!fields.contains("shape") || !fields.contains("typestr"))
    refuse_range(what, "its __cuda_array_interface__ lacks 'shape' or 'typestr'");
  std::string typestr;
  std::vector<std::size_t> shape;
  std::optional<std::vector<long long>> strides;
  try {
    typestr = nb::cast<std::string>(fields["typestr"]);
    shape = nb::cast<std::vector<std::size_t>>(fields["shape"]);
    if (fields.contains("strides") && !nb::object(fields["strides"]).is_none())
      strides = nb::cast<std::vector<long long>>(fields["strides"]);
  } catch (const nb::cast_error&) {
    refuse_range(what,
                 "its __cuda_array_interface__'s typestr, shape or strides are not a str "
                 "and tuples of ints");
  }
  std::size_t item = 0;  // "<f4": byte order, kind, item size
  const char* end = typestr.data() + typestr.size();
  if (typestr.size() < 3 || std::from_chars(typestr.data() + 2, end, item).ptr != end || !item)
    refuse_range(what, "its typestr '" + typestr + "' names no item size");
  device_range range{interface->address, item};
  if (!strides) {
    for (const auto n : shape) range.bytes *= n;
    return range;
  }
  if (strides->size() != shape.size()) refuse_range(what, "its strides and shape differ in length");
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return {range.address, 0};
    const auto step = (*strides)[i];
    range.bytes += (shape[i] - 1) * static_cast<std::size_t>(step < 0 ? -step : step);
  }
  return range;
}

}  // namespace

void forget_array_protocols() noexcept {
  protocol_cache::instance().clear();
}

launch_signature signature_of(std::string name, std::span<const parameter_info> parameters) {
  launch_signature s{std::move(name), {parameters.begin(), parameters.end()}, {}};
  // A list that disagrees with the driver's count is not trusted: sizes are checked alone then.
  if (auto types = parameter_types(s.kernel_name); types && types->size() == s.parameters.size())
    s.types = std::move(*types);
  return s;
}

void convert_arguments(const launch_signature& s, std::span<PyObject* const> args,
                       const launch_config& config, kernel_arguments& out) {
  out.clear();
  if (args.size() != s.parameters.size())
    detail::throw_errc(errc::bad_launch_arguments, "Kernel.launch",
                       "kernel '" + s.kernel_name + "' takes " +
                           std::to_string(s.parameters.size()) + " parameters, " +
                           std::to_string(args.size()) + " arguments given");
  for (std::size_t i = 0; i < args.size(); ++i) convert_one(s, i, args[i], config, out);
}

const py_launch_config& launch_config_of(PyObject* config) {
  static PyTypeObject* const type =
      reinterpret_cast<PyTypeObject*>(nb::type<py_launch_config>().ptr());
  if (!PyObject_TypeCheck(config, type)) [[unlikely]]
    detail::throw_errc(
        errc::precondition, "Kernel.launch",
        "launch(config, *args) takes a cubridge.LaunchConfig first, not a " + type_name(config));
  return *nb::inst_ptr<py_launch_config>(config);
}

void add_fast_method(nb::handle cls, PyMethodDef& method) {
  const nb::object descriptor =
      nb::steal(PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &method));
  if (!descriptor.is_valid()) throw nb::python_error();
  nb::setattr(cls, method.ml_name, descriptor);
}

device_range as_device_range(nb::handle array, const std::string& what) {
  PyObject* o = array.ptr();
  if (nb::isinstance<device_view>(array)) {
    const auto& v = nb::cast<const device_view&>(array);
    return {v.address, v.bytes};
  }
  switch (protocol_of(Py_TYPE(o))) {
    case array_protocol::torch: {
      const auto on_gpu = torch_address(o);
      if (!on_gpu)
        refuse_range(what, "a torch tensor on the CPU was given; device memory is needed");
      return {*on_gpu, size_of(array.attr("numel")()) * size_of(array.attr("element_size")())};
    }
    case array_protocol::cupy:
      return {cupy_address(o), size_of(array.attr("nbytes"))};
    case array_protocol::cuda_array_interface:
      return interface_range(array, what);
    case array_protocol::dlpack: {
      const auto memory = read_dlpack(array);
      if (!memory) refuse_range(what, "a " + type_name(o) + " whose DLPack export failed");
      if (!memory->on_device())
        refuse_range(what, "a " + type_name(o) + " in host memory was given");
      return {memory->address, memory->bytes};
    }
    case array_protocol::none:
      if (PyObject_HasAttrString(o, "__cuda_array_interface__") == 1)  // on the object itself
        return interface_range(array, what);
      break;
  }
  refuse_range(what, "a " + type_name(o) +
                         " is no device memory: pass a torch or CuPy tensor, a DeviceView, a "
                         "SharedMemory, or an object with __cuda_array_interface__ or __dlpack__");
}

}  // namespace cubridge::python
