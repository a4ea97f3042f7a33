// detail::owning_handle, the one shape of the owning handles, checked without a GPU on a handle
// whose "destroy" is recorded. Every real owning type: test_owning_handles.cpp.
#include <cubridge/core/detail/owning_handle.hpp>
#include <cubridge/core/error.hpp>

#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

std::vector<int> destroyed;

struct recorded_traits {
  using value_type = int;
  static constexpr bool keeps_context = false;
  static constexpr std::string_view name = "test_handle";
  static int moved_from() noexcept { return -1; }
  static int native(int v) noexcept { return v; }
  static void destroy(int v, cubridge::detail::no_context) noexcept { destroyed.push_back(v); }
  static int release(int v) {
    CUBRIDGE_EXPECTS(v != 13, "13 is never given up");
    return v;
  }
};

struct test_handle : cubridge::detail::owning_handle<recorded_traits> {
  explicit test_handle(int v) : owning_handle(v, {}) {}
  [[nodiscard]] int plus_one() const { return owned() + 1; }  // an accessor of the type's own
};

static_assert(!std::is_copy_constructible_v<test_handle>);
static_assert(!std::is_copy_assignable_v<test_handle>);
static_assert(std::is_nothrow_move_constructible_v<test_handle>);
static_assert(std::is_nothrow_move_assignable_v<test_handle>);
static_assert(sizeof(test_handle) == sizeof(int), "no context share where none is kept");

void expect_moved_from_error(auto&& use) {
  try {
    use();
    ADD_FAILURE() << "a moved-from handle was used";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_handle was moved from or released"),
              std::string::npos)
        << e.what();
  }
}

TEST(OwningHandle, DestroysExactlyOnceAndMovesLeaveTheSentinel) {
  destroyed.clear();
  {
    test_handle a(1);
    test_handle b(std::move(a));
    EXPECT_TRUE(a.is_moved_from());  // NOLINT(bugprone-use-after-move): the sentinel is the point
    EXPECT_FALSE(b.is_moved_from());
    EXPECT_EQ(b.get(), 1);
    expect_moved_from_error([&] { (void)a.get(); });  // NOLINT(bugprone-use-after-move)
    expect_moved_from_error([&] { (void)a.plus_one(); });
    expect_moved_from_error([&] { (void)a.release(); });
  }
  EXPECT_EQ(destroyed, std::vector<int>{1});
}

TEST(OwningHandle, MoveAssignmentDestroysWhatItReplacesThroughTheDestructor) {
  destroyed.clear();
  {
    test_handle a(1);
    test_handle b(2);
    a = std::move(b);
    EXPECT_EQ(destroyed, std::vector<int>{1});
    EXPECT_EQ(a.get(), 2);
    EXPECT_TRUE(b.is_moved_from());  // NOLINT(bugprone-use-after-move)
    b = test_handle(3);              // a moved-from handle takes a new value
    EXPECT_EQ(b.plus_one(), 4);
    auto& alias = a;
    a = std::move(alias);  // self-move keeps the value
    EXPECT_EQ(a.get(), 2);
    EXPECT_EQ(destroyed, std::vector<int>{1});
  }
  EXPECT_EQ(destroyed, (std::vector<int>{1, 3, 2}));
}

TEST(OwningHandle, ReleaseGivesUpOwnershipOrRefusesWithoutChangingAnything) {
  destroyed.clear();
  {
    test_handle a(7);
    EXPECT_EQ(a.release(), 7);
    EXPECT_TRUE(a.is_moved_from());
    expect_moved_from_error([&] { (void)a.release(); });
    test_handle kept(13);
    EXPECT_THROW((void)kept.release(), cubridge::error);
    EXPECT_EQ(kept.get(), 13) << "a refused release leaves the handle as it was";
  }
  EXPECT_EQ(destroyed, std::vector<int>{13});
}

TEST(OwningHandle, SwapExchangesValues) {
  destroyed.clear();
  {
    test_handle a(1);
    test_handle b(2);
    a.swap(b);
    EXPECT_EQ(a.get(), 2);
    EXPECT_EQ(b.get(), 1);
  }
  EXPECT_EQ(destroyed, (std::vector<int>{1, 2}));
}

}  // namespace
