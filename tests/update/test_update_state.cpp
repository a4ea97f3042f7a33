// Tests of cubridge/update/update_state.hpp: the update endpoint's replay state, in memory and in
// its file (written atomically, read strictly: a file that cannot be used is an error, never an
// empty state).
#include <cubridge/update/update_state.hpp>

#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

using cubridge::nonce_outcome;
using cubridge::update_state;
using cubridge::update_state_error;
using cubridge::update_state_reason;
using namespace std::chrono_literals;

const std::chrono::sys_seconds noon =
    std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{12};
const std::string nonce_a = "00112233445566778899aabbccddeeff";
const std::string nonce_b = "ffeeddccbbaa99887766554433221100";

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// What load() raises for `path`, with the reason checked and the path named in the message.
void expect_load_fails(const std::filesystem::path& path, update_state_reason reason) {
  update_state state(path);
  try {
    state.load();
    ADD_FAILURE() << "load of " << path << " did not throw";
  } catch (const update_state_error& e) {
    EXPECT_EQ(e.reason(), reason) << e.what();
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos)
        << "the message names the file: " << e.what();
  }
}

class UpdateStateTest : public ::testing::Test {
 protected:
  cubridge::testing::temp_dir dir;
  std::filesystem::path file = dir.path / "replay.json";
};

TEST_F(UpdateStateTest, InMemoryStateRemembersWithoutAFile) {
  update_state state;
  EXPECT_TRUE(state.file().empty());
  EXPECT_NO_THROW(state.load());
  EXPECT_EQ(state.highest_version("filters"), 0u);
  state.store_highest_version("filters", 7);
  EXPECT_EQ(state.highest_version("filters"), 7u);
  state.raise_highest_version("filters", 5);
  EXPECT_EQ(state.highest_version("filters"), 7u) << "raise never lowers";
  state.raise_highest_version("blur", 2);
  EXPECT_EQ(state.highest_versions(),
            (std::map<std::string, std::uint64_t, std::less<>>{{"blur", 2}, {"filters", 7}}));
  EXPECT_EQ(state.remember_nonce(nonce_a, noon, noon - 600s, 10), nonce_outcome::fresh);
  EXPECT_EQ(state.remember_nonce(nonce_a, noon, noon - 600s, 10), nonce_outcome::replayed);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

TEST_F(UpdateStateTest, AMissingFileIsAFirstStart) {
  update_state state(file);
  EXPECT_NO_THROW(state.load());
  EXPECT_EQ(state.highest_versions().size(), 0u);
  EXPECT_EQ(state.nonce_count(), 0u);
  EXPECT_FALSE(std::filesystem::exists(file)) << "loading writes nothing";
}

TEST_F(UpdateStateTest, EveryChangeIsInTheFileWhenTheCallReturns) {
  {
    update_state state(file);
    state.load();
    state.store_highest_version("filters", 7);
    EXPECT_EQ(read_text(file),
              "{\"cubridge_update_state\":1,\"highest_versions\":{\"filters\":7},"
              "\"rollback_nonces\":{}}\n");
    EXPECT_EQ(state.remember_nonce(nonce_a, noon, noon - 600s, 10), nonce_outcome::fresh);
    state.store_highest_version("blur", 18446744073709551615u);
  }
  struct ::stat status {};
  ASSERT_EQ(::stat(file.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0600u);
  // Only the file itself: no temporary file is left beside it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path),
                          std::filesystem::directory_iterator()),
            1);

  update_state restarted(file);
  restarted.load();
  EXPECT_EQ(restarted.highest_version("filters"), 7u);
  EXPECT_EQ(restarted.highest_version("blur"), 18446744073709551615u);
  EXPECT_EQ(restarted.remember_nonce(nonce_a, noon, noon - 600s, 10), nonce_outcome::replayed);
  EXPECT_EQ(restarted.remember_nonce(nonce_b, noon, noon - 600s, 10), nonce_outcome::fresh);
}

TEST_F(UpdateStateTest, StoringALowerVersionUndoesARecord) {
  update_state state(file);
  state.store_highest_version("filters", 3);
  state.store_highest_version("filters", 4);  // as before an apply
  state.store_highest_version("filters", 3);  // the apply failed
  update_state restarted(file);
  restarted.load();
  EXPECT_EQ(restarted.highest_version("filters"), 3u);
  state.store_highest_version("blur", 1);
  state.store_highest_version("blur", 0);  // nothing was recorded before
  update_state again(file);
  again.load();
  EXPECT_EQ(again.highest_versions().count("blur"), 0u);
}

TEST_F(UpdateStateTest, APendingVersionIsRecordedSettledAndPersisted) {
  {
    update_state state(file);
    state.load();
    state.store_highest_version("filters", 3);
    EXPECT_FALSE(state.pending("filters"));
    state.record_pending("filters", 4);  // as before an apply
    EXPECT_TRUE(state.pending("filters"));
    EXPECT_EQ(state.highest_version("filters"), 4u);
    EXPECT_EQ(read_text(file),
              "{\"cubridge_update_state\":1,\"highest_versions\":{\"filters\":4},"
              "\"pending_versions\":{\"filters\":4},\"rollback_nonces\":{}}\n");
  }  // "killed" before the apply's outcome was known
  update_state restarted(file);
  restarted.load();
  EXPECT_TRUE(restarted.pending("filters"));
  EXPECT_EQ(restarted.highest_version("filters"), 4u);
  EXPECT_FALSE(restarted.pending("blur"));
  restarted.settle("filters");
  EXPECT_FALSE(restarted.pending("filters"));
  EXPECT_EQ(restarted.highest_version("filters"), 4u);
  // Settled, the file is the format without the field again.
  EXPECT_EQ(read_text(file),
            "{\"cubridge_update_state\":1,\"highest_versions\":{\"filters\":4},"
            "\"rollback_nonces\":{}}\n");
  update_state again(file);
  again.load();
  EXPECT_FALSE(again.pending("filters"));
  // A stored version (an undo, a floor) is settled; so is one under a floor at or above it.
  again.record_pending("filters", 5);
  again.store_highest_version("filters", 4);
  EXPECT_FALSE(again.pending("filters"));
  again.record_pending("filters", 5);
  again.raise_highest_version("filters", 4);
  EXPECT_TRUE(again.pending("filters"));
  again.raise_highest_version("filters", 5);
  EXPECT_FALSE(again.pending("filters"));
}

TEST_F(UpdateStateTest, AFileWithoutPendingVersionsIsSettled) {
  // As written before the field existed.
  cubridge::testing::write_text(file,
                                "{\"cubridge_update_state\":1,\"highest_versions\":{\"filters\":7},"
                                "\"rollback_nonces\":{}}\n");
  update_state state(file);
  state.load();
  EXPECT_EQ(state.highest_version("filters"), 7u);
  EXPECT_FALSE(state.pending("filters"));
  EXPECT_TRUE(state.bad_versions().empty()) << "nor any bad version";
}

TEST_F(UpdateStateTest, LoadKeepsAPendingMarkOnlyWithTheHigherVersion) {
  {
    update_state writer(file);
    writer.record_pending("filters", 7);
    writer.record_pending("blur", 2);
    writer.record_pending("sharpen", 4);
  }
  update_state state(file);
  state.raise_highest_version("filters", 9);  // higher, settled: the file's mark is gone
  state.raise_highest_version("blur", 2);     // equal, settled here: settled
  state.raise_highest_version("sharpen", 1);  // lower: the file's pending 4 stands
  state.load();
  EXPECT_FALSE(state.pending("filters"));
  EXPECT_EQ(state.highest_version("filters"), 9u);
  EXPECT_FALSE(state.pending("blur"));
  EXPECT_TRUE(state.pending("sharpen"));
  EXPECT_EQ(state.highest_version("sharpen"), 4u);
}

TEST_F(UpdateStateTest, AFailedPendingRecordOrSettleIsTheSafeSide) {
  const auto directory = dir.path / "state";
  std::filesystem::create_directory(directory);
  update_state state(directory / "replay.json");
  state.store_highest_version("filters", 3);
  std::filesystem::rename(directory, dir.path / "moved");  // every later write fails
  EXPECT_THROW(state.record_pending("filters", 4), update_state_error);
  EXPECT_EQ(state.highest_version("filters"), 3u);
  EXPECT_FALSE(state.pending("filters"));
  std::filesystem::rename(dir.path / "moved", directory);
  state.record_pending("filters", 4);
  std::filesystem::rename(directory, dir.path / "moved");
  // The outcome is known: settled in memory even when the file cannot say so.
  EXPECT_THROW(state.settle("filters"), update_state_error);
  EXPECT_FALSE(state.pending("filters"));
  EXPECT_EQ(state.highest_version("filters"), 4u);
}

TEST_F(UpdateStateTest, LoadMergesWithWhatIsHeld) {
  {
    update_state writer(file);
    writer.store_highest_version("filters", 7);
    writer.store_highest_version("blur", 2);
  }
  update_state state(file);
  state.raise_highest_version("filters", 9);  // e.g. a floor from the configuration
  state.raise_highest_version("blur", 1);
  state.load();
  EXPECT_EQ(state.highest_version("filters"), 9u);
  EXPECT_EQ(state.highest_version("blur"), 2u);
}

TEST_F(UpdateStateTest, NoncesAreForgottenOutsideTheirWindowAndBounded) {
  update_state state(file);
  EXPECT_EQ(state.remember_nonce(nonce_a, noon, noon - 600s, 2), nonce_outcome::fresh);
  EXPECT_EQ(state.remember_nonce(nonce_b, noon + 10s, noon - 600s, 2), nonce_outcome::fresh);
  EXPECT_EQ(state.remember_nonce("0123456789abcdef0123456789abcdef", noon, noon - 600s, 2),
            nonce_outcome::full);
  // Later: nonce_a's request is older than the window, so it is forgotten (it would be refused
  // as expired anyway), which makes room.
  EXPECT_EQ(state.remember_nonce("0123456789abcdef0123456789abcdef", noon + 700s, noon + 5s, 2),
            nonce_outcome::fresh);
  EXPECT_EQ(state.nonce_count(), 2u);
  update_state restarted(file);
  restarted.load();
  EXPECT_EQ(restarted.nonce_count(), 2u);
  EXPECT_EQ(restarted.remember_nonce(nonce_b, noon + 10s, noon + 5s, 10), nonce_outcome::replayed);
}

TEST_F(UpdateStateTest, ACorruptFileIsAnErrorNamingIt) {
  const std::string good_nonces = "\"rollback_nonces\":{}";
  for (const std::string& text : std::vector<std::string>{
           std::string(""), std::string("{"), std::string("garbage"), std::string("[]"),
           std::string("{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":7}}"),
           "{\"cubridge_update_state\":2,\"highest_versions\":{}," + good_nonces + "}",
           "{\"highest_versions\":{}," + good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":0}," + good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":-1}," + good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":1.5}," + good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":\"7\"}," + good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":18446744073709551616}," +
               good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"../x\":7}," + good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{},\"rollback_nonces\":{\"short\":"
           "\"2026-11-29T12:00:00Z\"}}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{},\"rollback_nonces\":{\"" +
               nonce_a + "\":\"yesterday\"}}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{}," + good_nonces + ",\"extra\":1}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{}," + good_nonces + "}" +
               std::string(1, '\0') + "{\"more\":1}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"\xff\":7}," + good_nonces + "}",
           // A pending version is the module's highest one, in an object.
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":7},\"pending_versions\":[]," +
               good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":7},\"pending_versions\":{"
           "\"f\":6}," +
               good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":7},\"pending_versions\":{"
           "\"g\":7}," +
               good_nonces + "}",
           "{\"cubridge_update_state\":1,\"highest_versions\":{\"f\":7},\"pending_versions\":{"
           "\"f\":\"7\"}," +
               good_nonces + "}"}) {
    SCOPED_TRACE(::testing::PrintToString(text));
    cubridge::testing::write_text(file, text);
    expect_load_fails(file, update_state_reason::corrupt);
  }
}

TEST_F(UpdateStateTest, AnOverLargeFileIsAnError) {
  cubridge::testing::write_text(file, "{}");
  std::filesystem::resize_file(file, cubridge::max_update_state_bytes + 1);  // sparse
  expect_load_fails(file, update_state_reason::too_large);
}

TEST_F(UpdateStateTest, AnUnreadableFileIsAnError) {
  std::filesystem::create_directory(file);  // a directory where the file should be
  expect_load_fails(file, update_state_reason::unreadable);
  std::filesystem::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);  // must not block the start
  expect_load_fails(file, update_state_reason::unreadable);
}

TEST_F(UpdateStateTest, AFailedWriteChangesNothing) {
  update_state state(dir.path / "gone" / "replay.json");  // its directory does not exist
  state.raise_highest_version("filters", 3);
  try {
    state.store_highest_version("filters", 4);
    ADD_FAILURE() << "the write did not fail";
  } catch (const update_state_error& e) {
    EXPECT_EQ(e.reason(), update_state_reason::write_failed);
    EXPECT_NE(std::string(e.what()).find((dir.path / "gone" / "replay.json").string()),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(state.highest_version("filters"), 3u);
  // A nonce whose use could not be written stays remembered: the request is not honoured later.
  EXPECT_THROW((void)state.remember_nonce(nonce_a, noon, noon - 600s, 10), update_state_error);
  EXPECT_EQ(state.remember_nonce(nonce_a, noon, noon - 600s, 10), nonce_outcome::replayed);
}

TEST_F(UpdateStateTest, ARewriteReplacesTheFileAsAWhole) {
  update_state state(file);
  state.store_highest_version("filters", 1);
  const auto before = read_text(file);
  // A hard link to the old file keeps the old state: the old file is never written in place,
  // so a crash in the middle of a write leaves it whole.
  ASSERT_EQ(::link(file.c_str(), (dir.path / "old.json").c_str()), 0);
  state.store_highest_version("filters", 2);
  EXPECT_EQ(read_text(dir.path / "old.json"), before);
  EXPECT_NE(read_text(file), before);
  update_state restarted(file);
  restarted.load();
  EXPECT_EQ(restarted.highest_version("filters"), 2u);
}

// --- payloads recorded as bad ---------------------------------------------------------------

std::string digest_of(int n) {
  std::string text = std::to_string(n);
  return std::string(64 - text.size(), '0') + text;  // 64 decimal digits: lower-case hex
}

cubridge::bad_version bad(const std::string& module, int n,
                          cubridge::gate_reason reason = cubridge::gate_reason::sticky_error) {
  return {module, digest_of(n), static_cast<std::uint64_t>(n) + 1, reason,
          noon + std::chrono::seconds(n)};
}

TEST_F(UpdateStateTest, BadVersionsAreRecordedOnceWrittenAtOnceAndReadBack) {
  const std::string digest(64, 'e');
  {
    update_state state(file);
    state.load();
    EXPECT_TRUE(state.record_bad(
        {"filters", digest, 6, cubridge::gate_reason::faulted_in_probation, noon}));
    EXPECT_EQ(read_text(file),
              "{\"bad_versions\":{\"filters\":[{\"digest\":\"" + digest +
                  "\",\"reason\":\"faulted_in_probation\",\"time\":\"2026-11-29T12:00:00Z\","
                  "\"version\":6}]},\"cubridge_update_state\":1,\"highest_versions\":{},"
                  "\"rollback_nonces\":{}}\n");
    // The first record stands: the same payload again (under another version) changes nothing.
    EXPECT_FALSE(
        state.record_bad({"filters", digest, 7, cubridge::gate_reason::sticky_error, noon}));
    EXPECT_TRUE(state.record_bad(bad("blur", 1)));
    EXPECT_FALSE(state.find_bad("filters", digest_of(1)));
    EXPECT_FALSE(state.find_bad("sharpen", digest));
  }
  update_state restarted(file);
  restarted.load();
  const auto found = restarted.find_bad("filters", digest);
  ASSERT_TRUE(found);
  EXPECT_EQ(*found, (cubridge::bad_version{"filters", digest, 6,
                                           cubridge::gate_reason::faulted_in_probation, noon}));
  EXPECT_EQ(restarted.bad_versions(),
            (std::vector<cubridge::bad_version>{bad("blur", 1), *found}));  // by module name
}

TEST_F(UpdateStateTest, AtMostTheBoundOfBadVersionsPerModuleTheOldestDropped) {
  const int bound = static_cast<int>(cubridge::max_bad_versions_per_module);
  update_state state;  // in memory (no write per record); the file's bound is the load's, below
  for (int n = 0; n <= bound; ++n) EXPECT_TRUE(state.record_bad(bad("filters", n)));
  EXPECT_TRUE(state.record_bad(bad("blur", 0)));  // another module's records are its own
  EXPECT_FALSE(state.find_bad("filters", digest_of(0))) << "the oldest was dropped";
  const auto all = state.bad_versions();
  ASSERT_EQ(all.size(), cubridge::max_bad_versions_per_module + 1);
  EXPECT_EQ(all[0], bad("blur", 0));
  EXPECT_EQ(all[1], bad("filters", 1));  // oldest first
  EXPECT_EQ(all.back(), bad("filters", bound));
  // A file holding more (written with a larger bound) keeps its newest.
  std::string entries;
  for (int n = 0; n < bound + 2; ++n)
    entries += std::string(n == 0 ? "" : ",") + "{\"digest\":\"" + digest_of(n) +
               "\",\"version\":1,\"reason\":\"known_bad\",\"time\":\"2026-11-29T12:00:00Z\"}";
  cubridge::testing::write_text(file,
                                "{\"cubridge_update_state\":1,\"highest_versions\":{},"
                                "\"bad_versions\":{\"filters\":[" +
                                    entries + "]},\"rollback_nonces\":{}}");
  update_state larger(file);
  larger.load();
  EXPECT_EQ(larger.bad_versions().size(), cubridge::max_bad_versions_per_module);
  EXPECT_FALSE(larger.find_bad("filters", digest_of(1)));
  EXPECT_TRUE(larger.find_bad("filters", digest_of(2)));
}

TEST_F(UpdateStateTest, ABadVersionIsCheckedAndKeptInMemoryWhenItsWriteFails) {
  update_state state(dir.path / "gone" / "replay.json");  // its directory does not exist
  for (const auto& wrong :
       {cubridge::bad_version{"../x", digest_of(1), 1, cubridge::gate_reason::sticky_error, noon},
        cubridge::bad_version{"filters", std::string(64, 'E'), 1,
                              cubridge::gate_reason::sticky_error, noon},
        cubridge::bad_version{"filters", digest_of(1), 0, cubridge::gate_reason::sticky_error,
                              noon},
        cubridge::bad_version{"filters", digest_of(1), 1, cubridge::gate_reason::none, noon}}) {
    try {
      (void)state.record_bad(wrong);
      ADD_FAILURE() << wrong.module << " " << wrong.digest << " was recorded";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();  // before any write
    }
  }
  EXPECT_THROW((void)state.record_bad(bad("filters", 1)), update_state_error);
  EXPECT_TRUE(state.find_bad("filters", digest_of(1))) << "the safe side: still refused here";
}

TEST_F(UpdateStateTest, ACorruptBadVersionsFieldIsAnErrorNamingTheFile) {
  const auto entry = [](const std::string& fields) {
    return "{\"cubridge_update_state\":1,\"highest_versions\":{},\"rollback_nonces\":{},"
           "\"bad_versions\":{\"filters\":[{" +
           fields + "}]}}";
  };
  const std::string digest = "\"digest\":\"" + digest_of(1) + "\"";
  const std::string rest =
      ",\"version\":3,\"reason\":\"sticky_error\",\"time\":\"2026-11-29T12:00:00Z\"";
  cubridge::testing::write_text(file, entry(digest + rest));
  {
    update_state good(file);
    good.load();
    EXPECT_TRUE(good.find_bad("filters", digest_of(1)));
  }
  const std::string base =
      "{\"cubridge_update_state\":1,\"highest_versions\":{},"
      "\"rollback_nonces\":{},\"bad_versions\":";
  for (const std::string& text : std::vector<std::string>{
           base + "[]}", base + "{\"filters\":{}}}", base + "{\"../x\":[]}}",
           base + "{\"filters\":[1]}}", entry(rest.substr(1)),
           entry("\"digest\":\"" + std::string(64, 'E') + "\"" + rest),
           entry("\"digest\":\"abc\"" + rest),
           entry(digest +
                 ",\"version\":0,\"reason\":\"sticky_error\",\"time\":\"2026-11-29T12:00:00Z\""),
           entry(
               digest +
               ",\"version\":\"3\",\"reason\":\"sticky_error\",\"time\":\"2026-11-29T12:00:00Z\""),
           entry(digest +
                 ",\"version\":3,\"reason\":\"Sticky_error\",\"time\":\"2026-11-29T12:00:00Z\""),
           entry(digest + ",\"version\":3,\"reason\":\"\",\"time\":\"2026-11-29T12:00:00Z\""),
           entry(digest + ",\"version\":3,\"reason\":\"sticky_error\",\"time\":\"yesterday\""),
           entry(digest + ",\"version\":3,\"reason\":\"sticky_error\""),
           entry(digest + rest + ",\"extra\":1"),
           base + "{\"filters\":[{" + digest + rest + "},{" + digest + rest + "}]}}"}) {
    SCOPED_TRACE(::testing::PrintToString(text));
    cubridge::testing::write_text(file, text);
    expect_load_fails(file, update_state_reason::corrupt);
  }
}

TEST(UpdateStateReason, KeepsItsSpelling) {
  using cubridge::to_string;
  using u = update_state_reason;
  EXPECT_EQ(to_string(u::unreadable), "unreadable");
  EXPECT_EQ(to_string(u::too_large), "too_large");
  EXPECT_EQ(to_string(u::corrupt), "corrupt");
  EXPECT_EQ(to_string(u::write_failed), "write_failed");
  EXPECT_EQ(to_string(static_cast<u>(99)), "unknown");
}

}  // namespace
