// The receiver's apply journal: entries survive a reopen, a torn tail is dropped, another
// version's journal is discarded, replay is idempotent and checks what it writes.
#include "receive/journal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace refit::internal {
namespace {

// Opens (or asserts) a journal into a new variable `name`.
#define ASSIGN_OR_FAIL_J(name, expr)                                   \
  auto name##_result = (expr);                                         \
  ASSERT_TRUE(name##_result.ok()) << name##_result.status().message(); \
  auto name = std::move(name##_result).value()

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "refit-journal-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
    path_ = dir_ + "/apply.journal";
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
  std::string dir_;
  std::string path_;
};

TEST_F(JournalTest, EntriesSurviveReopenAndReplayIntoTheirBox) {
  {
    ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 7, 6, /*durable=*/true));
    EXPECT_EQ(j->resumed_entries(), 0u);
    const uint16_t values[] = {0xAAAA, 0xBBBB};
    ASSERT_TRUE(
        j->Append("p0#1", "w", SubBox(), 2, {0, 5}, reinterpret_cast<const uint8_t*>(values)).ok());
    EXPECT_TRUE(j->Has("p0#1"));
  }
  ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 7, 6, true));
  EXPECT_EQ(j->resumed_entries(), 1u);
  EXPECT_TRUE(j->Has("p0#1"));
  EXPECT_FALSE(j->Has("p0#2"));
  std::vector<uint16_t> bits(24, 0);
  TensorView t = TensorW(bits);
  std::map<std::string, TensorView*> tensors = {{"w", &t}};
  ASSERT_TRUE(j->Replay(tensors).ok());
  ASSERT_TRUE(j->Replay(tensors).ok());  // idempotent
  // Box element 0 = (1, 2); element 5 = (2, 4).
  EXPECT_EQ(bits[1 * 6 + 2], 0xAAAA);
  EXPECT_EQ(bits[2 * 6 + 4], 0xBBBB);
  int nonzero = 0;
  for (uint16_t b : bits) nonzero += b != 0;
  EXPECT_EQ(nonzero, 2);
}

TEST_F(JournalTest, ATornLastEntryIsDroppedAndCutOff) {
  const uint16_t v = 0x1234;
  {
    ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 3, 2, false));
    ASSERT_TRUE(j->Append("a", "w", SubBox(), 2, {1}, reinterpret_cast<const uint8_t*>(&v)).ok());
    ASSERT_TRUE(j->Append("b", "w", SubBox(), 2, {2}, reinterpret_cast<const uint8_t*>(&v)).ok());
  }
  const auto full = std::filesystem::file_size(path_);
  for (uint64_t cut : {1, 5, 13}) {
    std::filesystem::resize_file(path_, full - cut);
    ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 3, 2, false));
    EXPECT_EQ(j->resumed_entries(), 1u) << cut;
    EXPECT_TRUE(j->Has("a"));
    EXPECT_FALSE(j->Has("b"));
    ASSERT_TRUE(j->Append("b", "w", SubBox(), 2, {2}, reinterpret_cast<const uint8_t*>(&v)).ok());
  }
  ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 3, 2, false));
  EXPECT_EQ(j->resumed_entries(), 2u);
}

TEST_F(JournalTest, AnotherVersionsJournalIsDiscarded) {
  const uint16_t v = 1;
  {
    ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 3, 2, false));
    ASSERT_TRUE(j->Append("a", "w", SubBox(), 2, {1}, reinterpret_cast<const uint8_t*>(&v)).ok());
  }
  ASSIGN_OR_FAIL_J(other_base, ApplyJournal::Open(path_, 3, 1, false));
  EXPECT_EQ(other_base->resumed_entries(), 0u);
  EXPECT_FALSE(other_base->Has("a"));
  ASSERT_TRUE(other_base->Remove().ok());
  EXPECT_FALSE(std::filesystem::exists(path_));
}

TEST_F(JournalTest, ReplayRefusesEntriesThatDoNotFitTheModel) {
  const uint16_t v = 1;
  {
    ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 3, 2, false));
    ASSERT_TRUE(j->Append("a", "w", SubBox(), 2, {6}, reinterpret_cast<const uint8_t*>(&v)).ok());
  }
  ASSIGN_OR_FAIL_J(j, ApplyJournal::Open(path_, 3, 2, false));
  std::vector<uint16_t> bits(24, 0);
  TensorView t = TensorW(bits);
  // Position 6 is outside the 2x3 box.
  Status st = j->Replay({{"w", &t}});
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.message();
  EXPECT_EQ(j->Replay({}).code(), StatusCode::kCorrupt);
  for (uint16_t b : bits) EXPECT_EQ(b, 0);
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

}  // namespace
}  // namespace refit::internal
