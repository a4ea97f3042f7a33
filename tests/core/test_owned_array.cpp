// The ownership shared by device_buffer and pinned_buffer, checked without a GPU.
#include <cubridge/core/detail/owned_array.hpp>

#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

namespace {

std::vector<void*> freed;

struct recording_free {
  void operator()(cubridge::context_ref, void* p) const noexcept { freed.push_back(p); }
};

struct test_array : cubridge::detail::owned_array<int, recording_free> {
  test_array(int* p, std::size_t n)
      : owned_array(cubridge::context_ref::from_native(nullptr), p, n) {}
};

static_assert(!std::is_copy_constructible_v<test_array>);
static_assert(std::is_nothrow_move_constructible_v<test_array>);
static_assert(std::is_nothrow_move_assignable_v<test_array>);

TEST(OwnedArray, FreesExactlyOnceAndMovesLeaveASentinel) {
  freed.clear();
  int storage[4] = {};
  {
    test_array a(storage, 4);
    EXPECT_EQ(a.size_bytes(), 4 * sizeof(int));
    test_array b(std::move(a));
    EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the sentinel is the point
    EXPECT_EQ(a.size(), 0u);
    EXPECT_EQ(b.data(), storage);
  }
  EXPECT_EQ(freed, std::vector<void*>{storage});
}

TEST(OwnedArray, MoveAssignmentFreesWhatItReplaces) {
  freed.clear();
  int first[1] = {}, second[1] = {};
  {
    test_array a(first, 1);
    test_array b(second, 1);
    a = std::move(b);
    EXPECT_EQ(freed, std::vector<void*>{first});
    EXPECT_EQ(a.data(), second);
  }
  EXPECT_EQ(freed, (std::vector<void*>{first, second}));
}

TEST(OwnedArray, ReleaseGivesUpOwnership) {
  freed.clear();
  int storage[2] = {};
  {
    test_array a(storage, 2);
    EXPECT_EQ(a.release(), storage);
    EXPECT_EQ(a.size(), 0u);
  }
  EXPECT_TRUE(freed.empty());
}

}  // namespace
