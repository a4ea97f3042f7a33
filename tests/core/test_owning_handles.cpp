// Every owning handle of the core has one shape (detail/owning_handle.hpp): move-only, a
// sentinel moved-from state, release(), an owning from_native, and accessors of a moved-from or
// released handle that throw error (errc::precondition) naming the type. One typed suite checks
// it for each: the moved-from part without a GPU (on adopted fake handles, released before they
// would reach the driver), the rest on a GPU.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/library.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::make_context;
using cubridge::testing::raw_current;

template <class T>
T fake() {
  return reinterpret_cast<T>(std::uintptr_t{0x1000});
}
cubridge::context_ref no_context() {
  return cubridge::context_ref::from_native(nullptr);
}

/// Uses of a handle, each named.
template <class Handle>
using accessor_list = std::vector<std::pair<const char*, std::function<void(const Handle&)>>>;

// Streams the stream destroy hook saw go.
std::vector<CUstream> destroyed_streams;
void record_destroyed(CUstream s) noexcept {
  destroyed_streams.push_back(s);
}

// One subject per owning type:
//   type, name (the type as messages name it), keeps_context (holds the context it was made in)
//   make(ctx): a new one in ctx; adopt_fake(): from_native of a handle no driver knows
//   use(h): works with it (fails the test if it does not)
//   destroyed(raw, ctx): whether the driver took it back, where the test can tell (nullopt else)
//   destroy_raw(raw, ctx): gives back what release() returned, with the raw driver
//   accessors(): every const accessor of the type

struct stream_subject {
  using type = cubridge::stream;
  static constexpr const char* name = "cubridge::stream";
  static constexpr bool keeps_context = true;
  static type make(const cubridge::context& ctx) { return type::create(ctx); }
  static type adopt_fake() { return type::from_native(fake<CUstream>(), no_context()); }
  static void use(const type& s) {
    s.synchronize();
    EXPECT_TRUE(s.ready());
  }
  static std::optional<bool> destroyed(CUstream raw, cubridge::context_ref) {
    return std::find(destroyed_streams.begin(), destroyed_streams.end(), raw) !=
           destroyed_streams.end();
  }
  static void destroy_raw(CUstream raw, cubridge::context_ref) {
    cubridge::before_stream_destroy(raw);
    CUBRIDGE_ASSERT_CU(cu().cuStreamDestroy(raw));
  }
  static accessor_list<type> accessors() {
    return {
        {"get", [](const type& s) { (void)s.get(); }},
        {"runtime_handle", [](const type& s) { (void)s.runtime_handle(); }},
        {"context", [](const type& s) { (void)s.context(); }},
        {"synchronize", [](const type& s) { s.synchronize(); }},
        {"ready", [](const type& s) { (void)s.ready(); }},
        {"wait", [](const type& s) { s.wait(cubridge::event_ref::from_native(fake<CUevent>())); }},
        {"as a stream_ref", [](const type& s) { (void)cubridge::stream_ref(s).get(); }}};
  }
};

struct event_subject {
  using type = cubridge::event;
  static constexpr const char* name = "cubridge::event";
  static constexpr bool keeps_context = true;
  static type make(const cubridge::context& ctx) { return type::create(ctx); }
  static type adopt_fake() { return type::from_native(fake<CUevent>(), no_context()); }
  static void use(const type& e) {
    auto s = cubridge::stream::create(e.context());
    e.record(s);
    e.synchronize();
    EXPECT_TRUE(e.ready());
  }
  static std::optional<bool> destroyed(CUevent, cubridge::context_ref) { return std::nullopt; }
  static void destroy_raw(CUevent raw, cubridge::context_ref) {
    CUBRIDGE_ASSERT_CU(cu().cuEventDestroy(raw));
  }
  static accessor_list<type> accessors() {
    return {{"get", [](const type& e) { (void)e.get(); }},
            {"runtime_handle", [](const type& e) { (void)e.runtime_handle(); }},
            {"context", [](const type& e) { (void)e.context(); }},
            {"record", [](const type& e) { e.record(cubridge::stream_ref::legacy_default()); }},
            {"synchronize", [](const type& e) { e.synchronize(); }},
            {"ready", [](const type& e) { (void)e.ready(); }},
            {"elapsed_ms_since", [](const type& e) { (void)e.elapsed_ms_since(e); }},
            {"as an event_ref", [](const type& e) { (void)cubridge::event_ref(e).get(); }}};
  }
};

struct module_subject {
  using type = cubridge::module;
  static constexpr const char* name = "cubridge::module";
  static constexpr bool keeps_context = true;  // through its state, which its kernels share
  static type make(const cubridge::context& ctx) {
    return type::load_file(ctx, cubridge::testing::test_cubin_path());
  }
  static type adopt_fake() { return type::from_native(fake<CUmodule>(), no_context(), "fake"); }
  static void use(const type& m) {
    EXPECT_NE(m.get_kernel("fill_u32").launch_handle(), nullptr);
    EXPECT_FALSE(m.name().empty());
  }
  static std::optional<bool> destroyed(CUmodule, cubridge::context_ref) { return std::nullopt; }
  static void destroy_raw(CUmodule raw, cubridge::context_ref ctx) {
    cubridge::scoped_current guard(ctx);
    CUBRIDGE_ASSERT_CU(cu().cuModuleUnload(raw));
  }
  static accessor_list<type> accessors() {
    return {{"get", [](const type& m) { (void)m.get(); }},
            {"name", [](const type& m) { (void)m.name(); }},
            {"context", [](const type& m) { (void)m.context(); }},
            {"info_log", [](const type& m) { (void)m.info_log(); }},
            {"get_kernel", [](const type& m) { (void)m.get_kernel("fill_u32"); }},
            {"get_global", [](const type& m) { (void)m.get_global("anything"); }}};
  }
};

struct library_subject {
  using type = cubridge::library;
  static constexpr const char* name = "cubridge::library";
  static constexpr bool keeps_context = false;  // a library belongs to no context
  static type make(const cubridge::context&) {
    return type::load_file(cubridge::testing::test_cubin_path());
  }
  static type adopt_fake() { return type::from_native(fake<CUlibrary>(), "fake"); }
  static void use(const type& l) {
    auto ctx = make_context();
    cubridge::scoped_current guard(ctx);
    EXPECT_NE(l.get_kernel("fill_u32").launch_handle(), nullptr);
  }
  static std::optional<bool> destroyed(CUlibrary, cubridge::context_ref) { return std::nullopt; }
  static void destroy_raw(CUlibrary raw, cubridge::context_ref) {
    CUBRIDGE_ASSERT_CU(cu().cuLibraryUnload(raw));
  }
  static accessor_list<type> accessors() {
    return {{"get", [](const type& l) { (void)l.get(); }},
            {"name", [](const type& l) { (void)l.name(); }},
            {"get_kernel", [](const type& l) { (void)l.get_kernel("fill_u32"); }}};
  }
};

struct context_subject {
  using type = cubridge::context;
  static constexpr const char* name = "cubridge::context";
  static constexpr bool keeps_context = false;  // it is the context
  static type make(const cubridge::context&) { return make_context(); }
  static type adopt_fake() { return type::from_native(fake<CUcontext>()); }
  static void use(const type& c) {
    EXPECT_NE(c.id(), 0u);
    cubridge::scoped_current guard(c);
    EXPECT_EQ(raw_current(), c.get());
  }
  static std::optional<bool> destroyed(CUcontext raw, cubridge::context_ref) {
    unsigned long long id = 0;
    return cu().cuCtxGetId(raw, &id) != CUDA_SUCCESS;
  }
  static void destroy_raw(CUcontext raw, cubridge::context_ref) {
    CUBRIDGE_ASSERT_CU(cu().cuCtxDestroy(raw));
  }
  static accessor_list<type> accessors() {
    return {{"get", [](const type& c) { (void)c.get(); }},
            {"ref", [](const type& c) { (void)c.ref(); }},
            {"as a context_ref",
             [](const type& c) {
               const cubridge::context_ref ref = c;
               (void)ref;
             }},
            {"as a context_arg",
             [](const type& c) {
               const cubridge::context_arg arg = c;
               (void)arg;
             }},
            {"device", [](const type& c) { (void)c.device(); }},
            {"id", [](const type& c) { (void)c.id(); }}};
  }
};

constexpr std::size_t buffer_size = 4096;

template <class Buffer>
struct device_buffer_subject {
  using type = Buffer;
  static constexpr const char* name = Buffer::api == cubridge::allocator_api::driver
                                          ? "cubridge::driver_buffer"
                                          : "cubridge::runtime_buffer";
  static constexpr bool keeps_context = true;
  static type make(const cubridge::context& ctx) { return type::allocate(ctx, buffer_size); }
  static type adopt_fake() {
    return type::from_native(fake<std::uint32_t*>(), buffer_size, no_context());
  }
  static void use(const type& b) {
    cubridge::scoped_current guard(b.context());
    CUBRIDGE_ASSERT_CU(cu().cuMemsetD32(b.address(), 0x600dcafe, b.size()));
    std::vector<std::uint32_t> host(b.size(), 0);
    CUBRIDGE_ASSERT_CU(cu().cuMemcpy(as_address(host.data()), b.address(), b.size_bytes()));
    for (const auto v : host) ASSERT_EQ(v, 0x600dcafeu);
  }
  static std::optional<bool> destroyed(std::uint32_t* raw, cubridge::context_ref ctx) {
    cubridge::scoped_current guard(ctx);
    CUcontext owner = nullptr;
    return cu().cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, as_address(raw)) !=
           CUDA_SUCCESS;
  }
  static void destroy_raw(std::uint32_t* raw, cubridge::context_ref ctx) {
    cubridge::scoped_current guard(ctx);
    if constexpr (Buffer::api == cubridge::allocator_api::driver)
      CUBRIDGE_ASSERT_CU(cu().cuMemFree(as_address(raw)));
    else
      ASSERT_EQ(cudaFree(raw), cudaSuccess);
  }
  static accessor_list<type> accessors() {
    return {{"get", [](const type& b) { (void)b.get(); }},
            {"data", [](const type& b) { (void)b.data(); }},
            {"size", [](const type& b) { (void)b.size(); }},
            {"size_bytes", [](const type& b) { (void)b.size_bytes(); }},
            {"context", [](const type& b) { (void)b.context(); }},
            {"address", [](const type& b) { (void)b.address(); }},
            {"span", [](const type& b) { (void)b.span(); }},
            {"as a device_span", [](const type& b) {
               const cubridge::device_span<const std::uint32_t> view = b;
               (void)view;
             }}};
  }
};

struct pinned_buffer_subject {
  using type = cubridge::pinned_buffer<std::uint32_t>;
  static constexpr const char* name = "cubridge::pinned_buffer";
  static constexpr bool keeps_context = true;
  static type make(const cubridge::context& ctx) { return type::allocate(ctx, buffer_size); }
  static type adopt_fake() {
    return type::from_native(fake<std::uint32_t*>(), buffer_size, no_context());
  }
  static void use(const type& b) {
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint32_t>(i * 3);
    EXPECT_EQ(b.span()[b.size() - 1], (b.size() - 1) * 3);
    cubridge::scoped_current guard(b.context());
    EXPECT_EQ(cubridge::memory_kind_of(b.data()), cubridge::memory_kind::host);
  }
  static std::optional<bool> destroyed(std::uint32_t* raw, cubridge::context_ref ctx) {
    cubridge::scoped_current guard(ctx);
    return cubridge::memory_kind_of(raw) == cubridge::memory_kind::unregistered_host;
  }
  static void destroy_raw(std::uint32_t* raw, cubridge::context_ref) {
    CUBRIDGE_ASSERT_CU(cu().cuMemFreeHost(raw));
  }
  static accessor_list<type> accessors() {
    return {{"get", [](const type& b) { (void)b.get(); }},
            {"data", [](const type& b) { (void)b.data(); }},
            {"size", [](const type& b) { (void)b.size(); }},
            {"size_bytes", [](const type& b) { (void)b.size_bytes(); }},
            {"context", [](const type& b) { (void)b.context(); }},
            {"span", [](const type& b) { (void)b.span(); }},
            {"operator[]", [](const type& b) { (void)b[0]; }}};
  }
};

using subjects =
    ::testing::Types<stream_subject, event_subject, module_subject, library_subject,
                     context_subject, device_buffer_subject<cubridge::driver_buffer<std::uint32_t>>,
                     device_buffer_subject<cubridge::runtime_buffer<std::uint32_t>>,
                     pinned_buffer_subject>;

struct subject_names {
  template <class Subject>
  static std::string GetName(int) {
    std::string n = Subject::name;
    return n.substr(n.find("::") + 2);
  }
};

template <class Subject>
class OwningHandles : public ::testing::Test {
 protected:
  void SetUp() override {
    destroyed_streams.clear();
    previous_hook_ = cubridge::set_stream_destroy_hook(&record_destroyed);
  }
  void TearDown() override { cubridge::set_stream_destroy_hook(previous_hook_); }

 private:
  cubridge::stream_destroy_hook previous_hook_ = nullptr;
};
TYPED_TEST_SUITE(OwningHandles, subjects, subject_names);

/// Expects `use` to throw error (errc::precondition) naming the type as moved from.
template <class Subject>
void expect_moved_from_error(const std::function<void()>& use, const char* what) {
  try {
    use();
    ADD_FAILURE() << what << " of a moved-from " << Subject::name << " did not throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(std::string(Subject::name) + " was moved from"),
              std::string::npos)
        << what << ": " << e.what();
  }
}

/// Expects the driver to have taken `raw` back (or not), where it can tell for the type.
template <class Subject, class Raw>
void expect_destroyed(Raw raw, cubridge::context_ref ctx, bool expected, const char* why) {
  const auto gone = Subject::destroyed(raw, ctx);
  if (!gone) return;
  EXPECT_EQ(*gone, expected) << why;
}

TYPED_TEST(OwningHandles, IsMoveOnlyWithNothrowMoves) {
  using type = typename TypeParam::type;
  static_assert(!std::is_copy_constructible_v<type>);
  static_assert(!std::is_copy_assignable_v<type>);
  static_assert(std::is_nothrow_move_constructible_v<type>);
  static_assert(std::is_nothrow_move_assignable_v<type>);
  static_assert(std::is_nothrow_destructible_v<type>);
  static_assert(!std::is_default_constructible_v<type>, "made by a named factory only");
}

// Without a GPU: a fake handle is adopted, moved from, and released before any driver sees it.
TYPED_TEST(OwningHandles, EveryAccessorOfAMovedFromHandleThrowsNamingTheType) {
  auto adopted = TypeParam::adopt_fake();
  EXPECT_FALSE(adopted.is_moved_from());
  auto moved = std::move(adopted);
  // NOLINTBEGIN(bugprone-use-after-move): the moved-from state is the point
  EXPECT_TRUE(adopted.is_moved_from());
  const auto& gone = adopted;
  for (const auto& [what, use] : TypeParam::accessors())
    expect_moved_from_error<TypeParam>([&, &use = use] { use(gone); }, what);
  expect_moved_from_error<TypeParam>([&] { (void)adopted.release(); }, "release");
  // NOLINTEND(bugprone-use-after-move)
  EXPECT_FALSE(moved.is_moved_from());
  (void)moved.release();  // nothing reaches the driver
  EXPECT_TRUE(moved.is_moved_from());
  for (const auto& [what, use] : TypeParam::accessors())
    expect_moved_from_error<TypeParam>([&, &use = use] { use(moved); }, what);
}

TYPED_TEST(OwningHandles, MoveConstructionTransfersTheHandle) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  {
    auto original = TypeParam::make(ctx);
    const auto raw = original.get();
    auto moved = std::move(original);
    EXPECT_TRUE(original.is_moved_from());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(moved.get(), raw);
    TypeParam::use(moved);
    expect_destroyed<TypeParam>(raw, ctx, false, "a move destroyed it");
  }
  EXPECT_EQ(raw_current(), nullptr) << "the context stack is as it was";
}

TYPED_TEST(OwningHandles, MoveAssignmentDestroysTheOldValueOnce) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto target = TypeParam::make(ctx);
  auto source = TypeParam::make(ctx);
  const auto old_target = target.get();
  const auto old_source = source.get();
  ASSERT_NE(old_target, old_source);
  target = std::move(source);
  EXPECT_EQ(target.get(), old_source);
  EXPECT_TRUE(source.is_moved_from());  // NOLINT(bugprone-use-after-move)
  expect_destroyed<TypeParam>(old_target, ctx, true, "move assignment leaked what it replaced");
  expect_destroyed<TypeParam>(old_source, ctx, false, "move assignment destroyed what it took");
  TypeParam::use(target);
  auto& alias = target;
  target = std::move(alias);  // self-move keeps it
  EXPECT_EQ(target.get(), old_source);
  TypeParam::use(target);
  // A moved-from handle takes a new value and works again.
  source = TypeParam::make(ctx);
  EXPECT_FALSE(source.is_moved_from());
  TypeParam::use(source);
  EXPECT_EQ(raw_current(), nullptr);
}

TYPED_TEST(OwningHandles, ReleaseGivesUpOwnership) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  typename TypeParam::type::native_type raw{};
  {
    auto h = TypeParam::make(ctx);
    const auto expected = h.get();
    raw = h.release();
    EXPECT_EQ(raw, expected);
    EXPECT_TRUE(h.is_moved_from());
    EXPECT_THROW((void)h.release(), cubridge::error) << "released twice";
  }
  expect_destroyed<TypeParam>(raw, ctx, false, "a released handle must live on");
  TypeParam::destroy_raw(raw, ctx);
  EXPECT_EQ(raw_current(), nullptr);
}

TYPED_TEST(OwningHandles, KeepsItsContextAlive) {
  CUBRIDGE_REQUIRE_GPU();
  if constexpr (!TypeParam::keeps_context) {
    GTEST_SKIP() << TypeParam::name << " is made in no context it could keep alive";
  } else {
    std::optional<typename TypeParam::type> h;
    CUcontext raw = nullptr;
    {
      auto ctx = make_context();
      raw = ctx.get();
      h.emplace(TypeParam::make(ctx));
    }  // the context object is gone; the handle holds the context
    unsigned long long id = 0;
    EXPECT_EQ(cu().cuCtxGetId(raw, &id), CUDA_SUCCESS) << "the handle must keep its context alive";
    EXPECT_EQ(h->context().get(), raw);
    TypeParam::use(*h);
    h.reset();
    EXPECT_NE(cu().cuCtxGetId(raw, &id), CUDA_SUCCESS)
        << "the context must go with its last holder";
    EXPECT_EQ(raw_current(), nullptr);
  }
}

// Types that share their handle refuse release() while it is shared, and change nothing.

TEST(OwningHandles, AModuleIsNotReleasedUnderItsKernels) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto m = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  {
    const auto kernel = m.get_kernel("fill_u32");
    EXPECT_THROW((void)m.release(), cubridge::error);
    EXPECT_FALSE(m.is_moved_from());
    EXPECT_NE(m.get(), nullptr);
  }
  const CUmodule raw = m.release();
  cubridge::scoped_current guard(ctx);
  CUBRIDGE_ASSERT_CU(cu().cuModuleUnload(raw));
}

TEST(OwningHandles, ALibraryIsNotReleasedUnderItsKernels) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto l = cubridge::library::load_file(cubridge::testing::test_cubin_path());
  {
    cubridge::scoped_current guard(ctx);
    const auto kernel = l.get_kernel("fill_u32");
    EXPECT_THROW((void)l.release(), cubridge::error);
    EXPECT_FALSE(l.is_moved_from());
  }
  CUBRIDGE_ASSERT_CU(cu().cuLibraryUnload(l.release()));
}

TEST(OwningHandles, AContextIsNotReleasedUnderWhatWasCreatedInIt) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  {
    auto s = cubridge::stream::create(ctx);
    EXPECT_THROW((void)ctx.release(), cubridge::error);
    EXPECT_FALSE(ctx.is_moved_from());
  }
  const CUcontext raw = ctx.release();
  unsigned long long id = 0;
  EXPECT_EQ(cu().cuCtxGetId(raw, &id), CUDA_SUCCESS) << "a released context must live on";
  CUBRIDGE_ASSERT_CU(cu().cuCtxDestroy(raw));
}

TEST(OwningHandles, FromNativeRefusesWhatCannotBeOwned) {
  const auto ctx = no_context();
  EXPECT_THROW((void)cubridge::stream::from_native(nullptr, ctx), cubridge::error);
  EXPECT_THROW((void)cubridge::stream::from_native(CU_STREAM_LEGACY, ctx), cubridge::error);
  EXPECT_THROW((void)cubridge::stream::from_native(CU_STREAM_PER_THREAD, ctx), cubridge::error);
  EXPECT_THROW((void)cubridge::event::from_native(nullptr, ctx), cubridge::error);
  EXPECT_THROW((void)cubridge::module::from_native(nullptr, ctx), cubridge::error);
  EXPECT_THROW((void)cubridge::library::from_native(nullptr), cubridge::error);
  EXPECT_THROW((void)cubridge::context::from_native(nullptr), cubridge::error);
  EXPECT_THROW((void)cubridge::driver_buffer<int>::from_native(nullptr, 4, ctx), cubridge::error);
  EXPECT_THROW((void)cubridge::pinned_buffer<int>::from_native(nullptr, 4, ctx), cubridge::error);
}

TEST(OwningHandles, FromNativeOwnsWhatItAdopts) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  CUstream raw_stream = nullptr;
  {
    cubridge::scoped_current guard(ctx);
    ASSERT_EQ(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking), cudaSuccess);
  }
  destroyed_streams.clear();
  const auto previous = cubridge::set_stream_destroy_hook(&record_destroyed);
  {
    auto s = cubridge::stream::from_native(raw_stream, ctx);
    EXPECT_EQ(s.get(), raw_stream);
    EXPECT_EQ(s.context(), ctx.ref());
    s.synchronize();
  }
  cubridge::set_stream_destroy_hook(previous);
  EXPECT_EQ(destroyed_streams, std::vector<CUstream>{raw_stream}) << "the adopted stream is gone";
  void* raw_memory = nullptr;
  {
    cubridge::scoped_current guard(ctx);
    ASSERT_EQ(cudaMalloc(&raw_memory, 1024), cudaSuccess);
  }
  {
    auto b = cubridge::runtime_buffer<std::byte>::from_native(static_cast<std::byte*>(raw_memory),
                                                              1024, ctx);
    EXPECT_EQ(b.context(), ctx.ref());
    EXPECT_EQ(cubridge::context_of(b.data()), ctx.ref());
  }
  cubridge::scoped_current guard(ctx);
  CUcontext owner = nullptr;
  EXPECT_NE(
      cu().cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, as_address(raw_memory)),
      CUDA_SUCCESS)
      << "the adopted memory is freed";
}

}  // namespace
