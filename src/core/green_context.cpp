#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/green_context.hpp>

namespace cubridge {

class green_context::owner final : public detail::context_owner {
 public:
  owner(CUgreenCtx green, CUcontext handle, unsigned sms) noexcept
      : context_owner(handle), green_(green), sm_count_(sms) {}
  ~owner() override {
    detail::check_release(driver::api().cuGreenCtxDestroy(green_), "cuGreenCtxDestroy");
  }
  CUgreenCtx green_;
  unsigned sm_count_;
};

green_context::green_context(std::shared_ptr<const owner> state) noexcept
    : state_(std::move(state)) {}

green_context green_context::create(cubridge::device dev, unsigned sm_count) {
  const std::string what =
      std::to_string(sm_count) + " SMs of device " + std::to_string(dev.ordinal());
  CUdevResource all{};
  CUBRIDGE_CU(cuDeviceGetDevResource, (dev.get(), &all, CU_DEV_RESOURCE_TYPE_SM), what);
  CUdevResource part{};
  CUdevResource rest{};
  unsigned groups = 1;
  CUBRIDGE_CU(cuDevSmResourceSplitByCount, (&part, &groups, &all, &rest, 0, sm_count), what);
  if (groups < 1)
    detail::throw_errc(
        errc::precondition, "cuDevSmResourceSplitByCount",
        "cannot carve " + what + " (the device has " + std::to_string(all.sm.smCount) + ")");
  CUdevResourceDesc desc{};
  CUBRIDGE_CU(cuDevResourceGenerateDesc, (&desc, &part, 1), what);
  CUgreenCtx green = nullptr;
  CUBRIDGE_CU(cuGreenCtxCreate, (&green, desc, dev.get(), CU_GREEN_CTX_DEFAULT_STREAM), what);
  CUcontext handle = nullptr;
  if (const CUresult r = driver::api().cuCtxFromGreenCtx(&handle, green); r != CUDA_SUCCESS) {
    driver::api().cuGreenCtxDestroy(green);
    detail::throw_driver_error(r, "cuCtxFromGreenCtx", what, std::source_location::current());
  }
  return green_context(std::make_shared<const owner>(green, handle, part.sm.smCount));
}

CUgreenCtx green_context::get_green() const noexcept {
  return state_ ? state_->green_ : nullptr;
}
CUcontext green_context::get() const noexcept {
  return state_ ? state_->get() : nullptr;
}
green_context::operator context_arg() const noexcept {
  return {ref(), state_};
}
unsigned green_context::sm_count() const noexcept {
  return state_ ? state_->sm_count_ : 0;
}

}  // namespace cubridge
