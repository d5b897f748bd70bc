// The redo log of a model file: entries survive a reopen, those past the last commit's size are
// an interrupted attempt, a torn tail is cut at any byte, replay is idempotent and checks what it
// writes, a checkpoint empties the log, and entries of another boot are known as such.
#include "receive/journal.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/file_util.h"
#include "refit/kernels/diff.h"

namespace refit::internal {
namespace {

// Opens (or asserts) a log into a new variable `name`.
#define ASSIGN_OR_FAIL_J(name, expr)                                   \
  auto name##_result = (expr);                                         \
  ASSERT_TRUE(name##_result.ok()) << name##_result.status().message(); \
  auto name = std::move(name##_result).value()

class RedoLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "refit-redo-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
    path_ = dir_ + "/redo.log";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A 4x6 i16 tensor; entries write into the box rows 1..2, cols 2..4.
  Box SubBox() const { return Box{{1, 2}, {2, 3}}; }
  // That tensor, "w", over bits (24 elements).
  static TensorView TensorW(std::vector<uint16_t>& bits) {
    TensorView t;
    t.name = "w";
    t.dtype = DType::kI16;
    t.shape = {4, 6};
    t.data = bits.data();
    return t;
  }
  // Stages one entry writing `value` at box position `pos` and flushes it.
  static void Write(RedoLog& log, const std::string& id, uint64_t pos, uint16_t value) {
    const uint64_t positions[] = {pos};
    ASSERT_TRUE(log.Stage(id, "w", Box{{1, 2}, {2, 3}}, 2, positions, 1,
                          reinterpret_cast<const uint8_t*>(&value))
                    .ok());
    ASSERT_TRUE(log.Flush().ok());
  }
  // Rewrites the header's boot id (bytes 12..47) and its checksum, as another boot would have.
  void MarkWrittenInAnotherBoot() const {
    std::fstream f(path_, std::ios::binary | std::ios::in | std::ios::out);
    std::string header(RedoLog::HeaderBytes(), '\0');
    f.read(header.data(), static_cast<std::streamsize>(header.size()));
    header.replace(12, 36, std::string(36, 'x'));
    const uint64_t digest = kernels::Digest64(header.data(), header.size() - 8);
    std::memcpy(header.data() + header.size() - 8, &digest, 8);
    f.seekp(0);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
  }
  std::string dir_;
  std::string path_;
};

TEST_F(RedoLogTest, EntriesSurviveReopenAndReplayIntoTheirBox) {
  uint64_t committed = 0;
  {
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, /*durable=*/true, 0));
    EXPECT_TRUE(log->empty());
    const uint16_t values[] = {0xAAAA, 0xBBBB};
    const uint64_t positions[] = {0, 5};
    ASSERT_TRUE(
        log->Stage("p0#1", "w", SubBox(), 2, positions, 2, reinterpret_cast<const uint8_t*>(values))
            .ok());
    EXPECT_FALSE(log->Has("p0#1"));  // staged, not yet written
    ASSERT_TRUE(log->Flush().ok());
    EXPECT_TRUE(log->Has("p0#1"));
    committed = log->bytes();
  }
  // Reopened with the size of the last commit: nothing past it, nothing interrupted.
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, true, committed));
  EXPECT_EQ(log->interrupted_entries(), 0u);
  EXPECT_FALSE(log->Has("p0#1"));
  EXPECT_FALSE(log->written_in_another_boot());
  std::vector<uint16_t> bits(24, 0);
  TensorView t = TensorW(bits);
  std::map<std::string, TensorView*> tensors = {{"w", &t}};
  ASSERT_TRUE(log->Replay(tensors).ok());
  ASSERT_TRUE(log->Replay(tensors).ok());  // idempotent
  // Box element 0 = (1, 2); element 5 = (2, 4).
  EXPECT_EQ(bits[1 * 6 + 2], 0xAAAA);
  EXPECT_EQ(bits[2 * 6 + 4], 0xBBBB);
  int nonzero = 0;
  for (uint16_t b : bits) nonzero += b != 0;
  EXPECT_EQ(nonzero, 2);
}

TEST_F(RedoLogTest, EntriesPastTheLastCommitAreAnInterruptedAttempt) {
  uint64_t committed = 0;
  {
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, 0));
    Write(*log, "v1#0", 0, 1);
    committed = log->bytes();
    Write(*log, "v2#0", 1, 2);
    Write(*log, "v2#1", 2, 3);
  }
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, committed));
  EXPECT_EQ(log->interrupted_entries(), 2u);
  EXPECT_FALSE(log->Has("v1#0"));
  EXPECT_TRUE(log->Has("v2#0"));
  EXPECT_TRUE(log->Has("v2#1"));
  // Replaying from the commit writes only the interrupted attempt's entries.
  std::vector<uint16_t> bits(24, 0);
  TensorView t = TensorW(bits);
  ASSERT_TRUE(log->Replay({{"w", &t}}, committed).ok());
  EXPECT_EQ(bits[1 * 6 + 2], 0);
  EXPECT_EQ(bits[1 * 6 + 3], 2);
  EXPECT_EQ(bits[1 * 6 + 4], 3);
  // An attempt redone whole drops them.
  ASSERT_TRUE(log->TruncateTo(committed).ok());
  EXPECT_EQ(log->bytes(), committed);
  EXPECT_FALSE(log->Has("v2#0"));
}

// A crash mid-write leaves the last entry torn at any byte: it is cut off, the ones before it
// replay, and the log takes new entries where it was cut.
TEST_F(RedoLogTest, ATornLastEntryIsCutAtEveryByte) {
  uint64_t committed = 0, first_end = 0, full = 0;
  {
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, 0));
    committed = log->bytes();
    Write(*log, "a", 1, 0x1111);
    first_end = log->bytes();
    Write(*log, "b", 2, 0x2222);
    full = log->bytes();
  }
  std::string bytes(full, '\0');
  {
    std::ifstream in(path_, std::ios::binary);
    in.read(bytes.data(), static_cast<std::streamsize>(full));
  }
  for (uint64_t cut = first_end; cut < full; ++cut) {
    {
      std::ofstream out(path_, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(cut));
    }
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, committed));
    ASSERT_EQ(log->interrupted_entries(), 1u) << "cut at " << cut;
    EXPECT_TRUE(log->Has("a"));
    EXPECT_FALSE(log->Has("b"));
    EXPECT_EQ(log->bytes(), first_end);
    EXPECT_EQ(std::filesystem::file_size(path_), first_end);
    std::vector<uint16_t> bits(24, 0);
    TensorView t = TensorW(bits);
    ASSERT_TRUE(log->Replay({{"w", &t}}).ok());
    EXPECT_EQ(bits[1 * 6 + 3], 0x1111);
    EXPECT_EQ(bits[1 * 6 + 4], 0);
    Write(*log, "b", 2, 0x2222);
  }
  // A flipped byte in the last entry is a torn entry too.
  bytes[full - 1] ^= 0x40;
  {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(full));
  }
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, committed));
  EXPECT_EQ(log->interrupted_entries(), 1u);
  EXPECT_EQ(log->bytes(), first_end);
}

TEST_F(RedoLogTest, ACheckpointEmptiesTheLogAndNamesTheVersion) {
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, true, 0));
  Write(*log, "a", 1, 7);
  EXPECT_FALSE(log->empty());
  ASSERT_TRUE(log->Checkpoint(12).ok());
  EXPECT_TRUE(log->empty());
  EXPECT_FALSE(log->Has("a"));
  ASSIGN_OR_FAIL_J(again, RedoLog::Open(path_, true, 0));
  EXPECT_EQ(again->checkpoint_version(), 12u);
  EXPECT_TRUE(again->empty());
  EXPECT_EQ(std::filesystem::file_size(path_), RedoLog::HeaderBytes());
}

// Entries written in another boot may describe pages that never reached the disk: the log says
// so until MarkCurrentBoot (after the owner replayed them all).
TEST_F(RedoLogTest, EntriesOfAnotherBootAreKnown) {
  {
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, 0));
    Write(*log, "a", 1, 7);
  }
  MarkWrittenInAnotherBoot();
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, std::filesystem::file_size(path_)));
  EXPECT_TRUE(log->written_in_another_boot());
  EXPECT_FALSE(log->empty());
  ASSERT_TRUE(log->MarkCurrentBoot().ok());
  ASSIGN_OR_FAIL_J(again, RedoLog::Open(path_, false, 0));
  EXPECT_FALSE(again->written_in_another_boot());
  EXPECT_TRUE(again->Has("a"));  // MarkCurrentBoot keeps the entries
}

// After a reboot, OpenRedoLog replays the committed entries only: those past the owner's clean
// size (a sender's pending changes, written unsynced, or an interrupted attempt) are the owner's
// to resume or drop, and stay indexed as such.
TEST_F(RedoLogTest, AnotherBootReplaysOnlyTheCommittedEntries) {
  uint64_t committed = 0;
  {
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, true, 0));
    Write(*log, "a", 0, 0x1111);
    committed = log->bytes();
    const uint64_t positions[] = {4};
    const uint16_t value = 0x4444;
    ASSERT_TRUE(
        log->Stage("p#0", "w", SubBox(), 2, positions, 1, reinterpret_cast<const uint8_t*>(&value))
            .ok());
    ASSERT_TRUE(log->Flush(/*sync=*/false).ok());
    EXPECT_TRUE(log->Has("p#0"));
    ASSERT_TRUE(log->Sync().ok());
  }
  MarkWrittenInAnotherBoot();
  std::vector<uint16_t> bits(24, 0);
  ASSIGN_OR_FAIL_J(log, OpenRedoLog(path_, true, committed, {TensorW(bits)}));
  EXPECT_EQ(bits[1 * 6 + 2], 0x1111);
  EXPECT_EQ(bits[2 * 6 + 3], 0);  // past the committed size: not replayed
  EXPECT_TRUE(log->Has("p#0"));
  EXPECT_EQ(log->interrupted_entries(), 1u);
}

TEST_F(RedoLogTest, ReplayRefusesEntriesThatDoNotFitTheModel) {
  {
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, 0));
    Write(*log, "a", 6, 1);  // position 6 is outside the 2x3 box
  }
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, 0));
  std::vector<uint16_t> bits(24, 0);
  TensorView t = TensorW(bits);
  Status st = log->Replay({{"w", &t}});
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.message();
  EXPECT_EQ(log->Replay({}).code(), StatusCode::kCorrupt);
  for (uint16_t b : bits) EXPECT_EQ(b, 0);
}

// Increasing positions are stored as a gap stream (smaller: the log's bytes are what its sync
// waits for), with escapes for long gaps; any other order keeps fixed-width positions. Both replay
// to the same bits, and a gap-coded position past the box is refused like a fixed one.
TEST_F(RedoLogTest, IncreasingPositionsAreGapCodedAndReplayExactly) {
  const uint64_t n = 200000;
  std::vector<uint64_t> increasing;
  for (uint64_t p = 3; p < n; p += 1 + (p % 97 == 0 ? 70000 : p % 300)) increasing.push_back(p);
  std::vector<uint64_t> shuffled = {9, 4, 150000, 4000, 77};
  std::vector<uint16_t> values(increasing.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(0x8000 + i);
  const Box box{{0}, {n}};
  uint64_t fixed_entry_bytes = 0;
  {
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, true, 0));
    ASSERT_TRUE(log->Stage("inc", "v", box, 2, increasing.data(), increasing.size(),
                           reinterpret_cast<const uint8_t*>(values.data()))
                    .ok());
    ASSERT_TRUE(log->Flush().ok());
    // Fixed width would be 4 + 2 bytes a change; gap-coded is well under.
    EXPECT_LT(log->bytes() - RedoLog::HeaderBytes(), increasing.size() * (4 + 2));
    const uint64_t before = log->bytes();
    ASSERT_TRUE(log->Stage("shuf", "v", box, 2, shuffled.data(), shuffled.size(),
                           reinterpret_cast<const uint8_t*>(values.data()))
                    .ok());
    ASSERT_TRUE(log->Flush().ok());
    fixed_entry_bytes = log->bytes() - before;
  }
  EXPECT_GE(fixed_entry_bytes, shuffled.size() * (4 + 2));
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, true, 0));
  std::vector<uint16_t> bits(n, 0);
  TensorView t;
  t.name = "v";
  t.dtype = DType::kI16;
  t.shape = {n};
  t.data = bits.data();
  ASSERT_TRUE(log->Replay({{"v", &t}}).ok());
  std::vector<uint16_t> want(n, 0);
  for (size_t i = 0; i < increasing.size(); ++i) want[increasing[i]] = values[i];
  for (size_t i = 0; i < shuffled.size(); ++i) want[shuffled[i]] = values[i];
  EXPECT_EQ(bits, want);
  // A gap-coded entry whose positions run past its box is refused, nothing written.
  ASSERT_TRUE(log->Checkpoint(1).ok());
  ASSERT_TRUE(log->Stage("oob", "v", Box{{0}, {1000}}, 2, increasing.data(), 50,
                         reinterpret_cast<const uint8_t*>(values.data()))
                  .ok());
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_GT(increasing[49], 1000u);
  std::fill(bits.begin(), bits.end(), 0);
  EXPECT_EQ(log->Replay({{"v", &t}}).code(), StatusCode::kCorrupt);
  EXPECT_EQ(bits, std::vector<uint16_t>(n, 0));
}

// One version's entries change disjoint elements: replayed on several threads they give the
// same bits as replayed in order.
TEST_F(RedoLogTest, DisjointEntriesReplayInParallelLikeInOrder) {
  const uint64_t n = 50000;
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, true, 0));
  for (uint64_t r = 0; r < 40; ++r) {
    std::vector<uint64_t> positions;
    std::vector<uint16_t> values;
    for (uint64_t p = r % 7; p < 1000; p += 3 + r % 5) {
      positions.push_back(p);
      values.push_back(static_cast<uint16_t>(r * 1000 + p));
    }
    ASSERT_TRUE(log->Stage("r" + std::to_string(r), "v", Box{{r * 1000}, {1000}}, 2,
                           positions.data(), positions.size(),
                           reinterpret_cast<const uint8_t*>(values.data()))
                    .ok());
  }
  ASSERT_TRUE(log->Flush().ok());
  std::vector<uint16_t> in_order(n, 1), parallel(n, 1);
  TensorView t;
  t.name = "v";
  t.dtype = DType::kI16;
  t.shape = {n};
  t.data = in_order.data();
  ASSERT_TRUE(log->Replay({{"v", &t}}).ok());
  t.data = parallel.data();
  ASSERT_TRUE(log->Replay({{"v", &t}}, 0, UINT64_MAX, /*disjoint_threads=*/3).ok());
  EXPECT_EQ(parallel, in_order);
  EXPECT_NE(in_order, std::vector<uint16_t>(n, 1));
}

TEST_F(RedoLogTest, AGarbageHeaderStartsAnEmptyLog) {
  {
    std::ofstream out(path_, std::ios::binary);
    out << std::string(200, 'z');
  }
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, false, 0));
  EXPECT_TRUE(log->empty());
  EXPECT_EQ(std::filesystem::file_size(path_), RedoLog::HeaderBytes());
}

// Entries of every size across block boundaries, flushed in batches, with a truncation and a
// checkpoint between them; the same on a log written through O_DIRECT (where the filesystem
// takes it) and on a buffered one.
void WriteScenario(RedoLog& log) {
  const Box box{{0}, {100000}};
  uint64_t seed = 7;
  std::vector<uint64_t> positions;
  std::vector<uint16_t> values;
  for (int round = 0; round < 3; ++round) {
    uint64_t truncate_to = 0;
    for (int e = 0; e < 24; ++e) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t count = 1 + (seed >> 33) % (e % 4 == 0 ? 4000 : 40);
      positions.clear();
      values.clear();
      for (uint64_t i = 0; i < count; ++i) {
        positions.push_back(i * 17 + (seed >> 60));
        values.push_back(static_cast<uint16_t>(seed >> (i % 48)));
      }
      const std::string id = "r" + std::to_string(round) + "#" + std::to_string(e);
      ASSERT_TRUE(log.Stage(id, "big", box, 2, positions.data(), count,
                            reinterpret_cast<const uint8_t*>(values.data()))
                      .ok());
      if (e % 3 == 2) {
        ASSERT_TRUE(log.Flush().ok());
      }
      if (e == 7) truncate_to = log.bytes();
    }
    ASSERT_TRUE(log.Flush().ok());
    if (round == 0) {
      ASSERT_TRUE(log.TruncateTo(truncate_to).ok());
    } else if (round == 1) {
      ASSERT_TRUE(log.Checkpoint(7).ok());
    }
  }
}

TEST_F(RedoLogTest, DirectWritesLeaveTheSameEntriesAsBufferedOnes) {
  const std::string buffered_path = dir_ + "/buffered.log";
  uint64_t bytes = 0;
  {
    ASSIGN_OR_FAIL_J(direct, RedoLog::Open(path_, /*durable=*/true, 0));
    direct->UseDirectWrites();
    WriteScenario(*direct);
    ASSIGN_OR_FAIL_J(buffered, RedoLog::Open(buffered_path, /*durable=*/true, 0));
    WriteScenario(*buffered);
    bytes = buffered->bytes();
    ASSERT_EQ(direct->bytes(), bytes);
  }
  std::string direct_bytes(bytes, '\0'), buffered_bytes(bytes, '\0');
  std::ifstream(path_, std::ios::binary)
      .read(direct_bytes.data(), static_cast<std::streamsize>(bytes));
  std::ifstream(buffered_path, std::ios::binary)
      .read(buffered_bytes.data(), static_cast<std::streamsize>(bytes));
  EXPECT_TRUE(direct_bytes == buffered_bytes) << "the logs differ before their end";
  // Reopened, the direct log's block padding is no entry: cut, and the same entries remain.
  ASSIGN_OR_FAIL_J(direct, RedoLog::Open(path_, true, 0));
  ASSIGN_OR_FAIL_J(buffered, RedoLog::Open(buffered_path, true, 0));
  EXPECT_EQ(direct->bytes(), bytes);
  EXPECT_EQ(std::filesystem::file_size(path_), bytes);
  EXPECT_EQ(direct->interrupted_entries(), buffered->interrupted_entries());
  EXPECT_EQ(direct->interrupted_entries(), 24u);  // the round after the checkpoint
  EXPECT_EQ(direct->checkpoint_version(), 7u);
}

// The direct writer reopens the log's path: a FIFO or another file planted there since the log
// was opened is neither waited on nor written; the entries go to the file the log holds.
TEST_F(RedoLogTest, DirectWritesNeverGoToWhatWasPlantedAtThePath) {
  for (const bool fifo : {true, false}) {
    SCOPED_TRACE(fifo ? "a FIFO" : "a regular file");
    std::filesystem::remove(path_);
    ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, /*durable=*/true, 0));
    const std::string held = dir_ + "/held.log";
    std::filesystem::rename(path_, held);
    if (fifo) {
      ASSERT_EQ(::mkfifo(path_.c_str(), 0644), 0);
    } else {
      std::ofstream(path_, std::ios::binary).flush();
    }
    log->UseDirectWrites();  // opening the FIFO for writing would wait for a reader for good
    Write(*log, "a", 1, 0x1234);
    if (!fifo) {
      EXPECT_EQ(std::filesystem::file_size(path_), 0u) << "the planted file was written";
    }
    EXPECT_EQ(std::filesystem::file_size(held), log->bytes());
    std::filesystem::remove(path_);
  }
}

TEST(BoxElementIndexTest, WalksTheBoxRowMajor) {
  const Shape shape = {3, 4, 5};
  const Box box{{1, 1, 2}, {2, 2, 3}};
  std::vector<uint64_t> got;
  for (uint64_t i = 0; i < 12; ++i) got.push_back(BoxElementIndex(shape, box, i));
  std::vector<uint64_t> want;
  for (uint64_t a = 1; a < 3; ++a)
    for (uint64_t b = 1; b < 3; ++b)
      for (uint64_t c = 2; c < 5; ++c) want.push_back((a * 4 + b) * 5 + c);
  EXPECT_EQ(got, want);
}

// A sender killed while its diff advanced the baseline left, past the advance's marker, the next
// version's pending changes: the restarted one finds where the marker ends and cuts the rest,
// written or only staged.
TEST_F(RedoLogTest, EndOfEntryFindsAMarkerAndTruncationDropsWhatFollowsIt) {
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, /*durable=*/true, 0));
  Write(*log, "pending#0", 0, 0x1111);
  ASSERT_TRUE(log->Stage("advance.v2", "", Box{}, 1, nullptr, 0, nullptr).ok());
  ASSERT_TRUE(log->Flush().ok());
  const uint64_t marker_end = log->bytes();
  Write(*log, "pending#0", 1, 0x2222);  // the next version's, written
  const uint64_t staged_position[] = {2};
  const uint16_t staged_value = 0x3333;
  ASSERT_TRUE(log->Stage("pending#1", "w", SubBox(), 2, staged_position, 1,
                         reinterpret_cast<const uint8_t*>(&staged_value))
                  .ok());
  auto end = log->EndOfEntry("advance.v2", RedoLog::HeaderBytes());
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(end.value(), marker_end);
  EXPECT_EQ(log->EndOfEntry("advance.v3", 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(log->EndOfEntry("advance.v2", marker_end).status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(log->TruncateTo(end.value()).ok());
  EXPECT_EQ(log->bytes(), marker_end);
  EXPECT_EQ(log->staged_bytes(), 0u) << "a staged entry of the dropped attempt survived";
  ASSERT_TRUE(log->Flush().ok());
  EXPECT_EQ(log->bytes(), marker_end);
  std::vector<uint16_t> bits(24, 0);
  ASSERT_TRUE(ReplayInto(*log, {TensorW(bits)}).ok());
  EXPECT_EQ(bits[1 * 6 + 2], 0x1111);  // box position 0
  EXPECT_EQ(bits[1 * 6 + 3], 0);       // box position 1: cut
  EXPECT_EQ(bits[1 * 6 + 4], 0);       // box position 2: was only staged
}

// An overlay holds one version's entries by where they lie: a reader's range gets exactly the
// changes inside it, ApplyRest writes the entries no range took whole (one taken in part again,
// whole), and Load declines entries over its budget or a box not contiguous in its tensor.
TEST_F(RedoLogTest, AnOverlayWritesEachChangeOfItsRangeAndTheRestOnce) {
  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, /*durable=*/true, 0));
  const uint16_t values[] = {0xA001, 0xA002, 0xA003};
  const uint64_t positions[] = {1, 7, 11};
  // Rows 1..2 of the 4x6 tensor (contiguous), and row 3 alone.
  ASSERT_TRUE(log->Stage("pending#0", "w", Box{{1, 0}, {2, 6}}, 2, positions, 3,
                         reinterpret_cast<const uint8_t*>(values))
                  .ok());
  const uint64_t last[] = {5};
  const uint16_t last_value = 0xB001;
  ASSERT_TRUE(log->Stage("pending#1", "w", Box{{3, 0}, {1, 6}}, 2, last, 1,
                         reinterpret_cast<const uint8_t*>(&last_value))
                  .ok());
  ASSERT_TRUE(log->Flush().ok());
  std::vector<uint16_t> bits(24, 0);
  auto loaded = RedoOverlay::Load(*log, 0, log->bytes(), {TensorW(bits)}, 1 << 20);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::unique_ptr<RedoOverlay> overlay = std::move(loaded).value();
  ASSERT_NE(overlay, nullptr);
  EXPECT_EQ(overlay->changes(), 4u);
  const auto at = [&](size_t i) { return reinterpret_cast<const uint8_t*>(bits.data() + i); };
  // Row 3: the second entry whole.
  ASSERT_TRUE(overlay->ApplyInPlace(at(18), 6 * 2).ok());
  EXPECT_EQ(bits[23], 0xB001);
  bits[23] = 0;  // so that a second write of it would show
  // Elements 6..13 (row 1 and two of row 2): positions 1 and 7 of the first entry only.
  ASSERT_TRUE(overlay->ApplyInPlace(at(6), 8 * 2).ok());
  EXPECT_EQ(bits[7], 0xA001);
  EXPECT_EQ(bits[13], 0xA002);
  EXPECT_EQ(bits[17], 0) << "a change past the range was written";
  // The first entry, taken in part, is written whole; the second is not written again.
  ASSERT_TRUE(overlay->ApplyRest().ok());
  std::vector<uint16_t> expected(24, 0);
  expected[7] = 0xA001;
  expected[13] = 0xA002;
  expected[17] = 0xA003;
  EXPECT_EQ(bits, expected);

  // Over the byte budget: declined.
  auto too_big = RedoOverlay::Load(*log, 0, log->bytes(), {TensorW(bits)}, 8);
  ASSERT_TRUE(too_big.ok());
  EXPECT_EQ(too_big.value(), nullptr);
  // Columns 2..4 of rows 1..2, not contiguous: declined.
  Write(*log, "pending#2", 0, 0xC001);
  auto declined = RedoOverlay::Load(*log, 0, log->bytes(), {TensorW(bits)}, 1 << 20);
  ASSERT_TRUE(declined.ok()) << declined.status().ToString();
  EXPECT_EQ(declined.value(), nullptr);
}

// Read through a registered file, an overlay patches the changes into the reader's copy and
// writes them to the file piece by piece (256 KiB): changes on both sides of a piece boundary,
// none lost or written outside the range read.
TEST_F(RedoLogTest, AnOverlayReadThroughAFilePatchesTheCopyAndTheFile) {
  SetMappedFileRegistrationBytesForTesting(1);
  const uint64_t n = 300000;  // i16 elements: 600 KB, three pieces
  const std::string file_path = dir_ + "/baseline";
  std::string zeros(n * 2, '\0');
  ASSERT_TRUE(WriteFileAtomic(file_path, zeros).ok());
  auto opened = MappedFile::Open(file_path, /*writable=*/true);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<MappedFile> file = std::move(opened).value();
  TensorView t;
  t.name = "w";
  t.dtype = DType::kI16;
  t.shape = {n};
  t.data = file->mutable_data();

  ASSIGN_OR_FAIL_J(log, RedoLog::Open(path_, /*durable=*/true, 0));
  // Two entries (boxes [0, 200000) and [200000, n)); changes every 997 elements and at both
  // sides of the first piece boundary (element 131072).
  std::vector<uint16_t> expected(n, 0);
  for (uint64_t box_start : {uint64_t{0}, uint64_t{200000}}) {
    const uint64_t box_end = box_start == 0 ? 200000 : n;
    std::vector<uint64_t> positions;
    std::vector<uint16_t> values;
    for (uint64_t e = box_start; e < box_end; ++e) {
      if (e % 997 != 3 && e != 131071 && e != 131072) continue;
      positions.push_back(e - box_start);
      values.push_back(static_cast<uint16_t>(e * 7 + 1));
      expected[e] = values.back();
    }
    ASSERT_TRUE(log->Stage("pending#" + std::to_string(box_start), "w",
                           Box{{box_start}, {box_end - box_start}}, 2, positions.data(),
                           positions.size(), reinterpret_cast<const uint8_t*>(values.data()))
                    .ok());
  }
  ASSERT_TRUE(log->Flush().ok());
  auto loaded = RedoOverlay::Load(*log, 0, log->bytes(), {t}, 1 << 20);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_NE(loaded.value(), nullptr);
  RedoOverlay& overlay = *loaded.value();
  // Elements [100000, 250000): across the entries' boundary and two piece boundaries.
  const uint64_t from = 100000, to = 250000;
  std::vector<uint16_t> copy(to - from, 0xFFFF);
  ASSERT_TRUE(overlay
                  .ReadPatched(t.bytes() + from * 2, (to - from) * 2,
                               reinterpret_cast<uint8_t*>(copy.data()))
                  .ok());
  EXPECT_TRUE(std::equal(copy.begin(), copy.end(), expected.begin() + from)) << "the copy";
  std::vector<uint16_t> on_disk(n);
  std::ifstream(file_path, std::ios::binary)
      .read(reinterpret_cast<char*>(on_disk.data()), static_cast<std::streamsize>(n * 2));
  for (uint64_t e = 0; e < n; ++e) {
    const uint16_t want = e >= from && e < to ? expected[e] : 0;
    ASSERT_EQ(on_disk[e], want) << "element " << e;
  }
  // The rest of both entries, once.
  ASSERT_TRUE(overlay.ApplyRest().ok());
  std::ifstream(file_path, std::ios::binary)
      .read(reinterpret_cast<char*>(on_disk.data()), static_cast<std::streamsize>(n * 2));
  EXPECT_EQ(on_disk, expected);
  file.reset();
  SetMappedFileRegistrationBytesForTesting(16ull << 20);
}

}  // namespace
}  // namespace refit::internal
