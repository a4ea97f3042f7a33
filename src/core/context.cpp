#include <cubridge/core/context.hpp>
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/scoped_current.hpp>

namespace cubridge {

context_ref context_ref::current() {
  CUcontext handle = nullptr;
  CUBRIDGE_CU(cuCtxGetCurrent, (&handle), "reading the current context");
  return context_ref(handle);
}

unsigned long long context_ref::id() const {
  unsigned long long value = 0;
  CUBRIDGE_CU(cuCtxGetId, (handle_, &value), "context " + detail::hex(handle_));
  return value;
}

device context_ref::device() const {
  scoped_current guard(*this);
  CUdevice dev{};
  CUBRIDGE_CU(cuCtxGetDevice, (&dev), "context " + detail::hex(handle_));
  return device::from_native(dev);
}

void context_ref::synchronize() const {
  scoped_current guard(*this);
  CUBRIDGE_CU(cuCtxSynchronize, (), describe());
}

std::string context_ref::describe() const noexcept {
  try {
    if (!handle_) return "no context";
    std::string text = "context " + detail::hex(handle_);
    if (!driver::available()) return text;
    unsigned long long value = 0;
    if (driver::api().cuCtxGetId(handle_, &value) == CUDA_SUCCESS)
      text += " (id " + std::to_string(value) + ")";
    else
      text += " (destroyed)";
    CUdevice dev{};
    if (driver::api().cuCtxPushCurrent(handle_) == CUDA_SUCCESS) {
      if (driver::api().cuCtxGetDevice(&dev) == CUDA_SUCCESS)
        text += " on device " + std::to_string(static_cast<int>(dev));
      CUcontext popped = nullptr;
      driver::api().cuCtxPopCurrent(&popped);
    }
    return text;
  } catch (...) {
    return "context";
  }
}

namespace {
class created_context final : public detail::context_owner {
 public:
  using context_owner::context_owner;
  ~created_context() override {
    if (!released_) detail::check_release(driver::api().cuCtxDestroy(get()), "cuCtxDestroy");
  }
  void disown() noexcept { released_ = true; }

 private:
  bool released_ = false;
};
}  // namespace

context context::create(cubridge::device dev, unsigned flags) {
  CUcontext handle = nullptr;
  // cuCtxCreate makes the new context current; pop it so the caller's stack is unchanged.
  CUBRIDGE_CU(cuCtxCreate, (&handle, nullptr, flags, dev.get()),
              "creating a context on device " + std::to_string(dev.ordinal()) + " with flags " +
                  std::to_string(flags));
  CUcontext popped = nullptr;
  detail::check_release(driver::api().cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
  return context(std::make_shared<created_context>(handle));
}

context context::from_native(CUcontext handle) {
  CUBRIDGE_EXPECTS(handle != nullptr, "adopting a context: a null handle is no context to own");
  return context(std::make_shared<created_context>(handle));
}

CUcontext detail::context_traits::release(value_type& owner) {
  // Streams, buffers and modules created in it hold shares: giving it up under them would leave
  // the caller destroying a context they still use.
  CUBRIDGE_EXPECTS(owner.use_count() == 1, "releasing " +
                                               context_ref::from_native(owner->get()).describe() +
                                               " while " + std::to_string(owner.use_count() - 1) +
                                               " objects created in it still hold it");
  static_cast<created_context&>(*owner).disown();
  return owner->get();
}

}  // namespace cubridge
