// SPDX-License-Identifier: Apache-2.0
// The timeline file on its own: per-rank names, escaping of any tensor name, a complete JSON
// array after stop, nothing recorded while stopped, and a restart that replaces the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "base/error.h"
#include "core/timeline.h"
#include "text_files.h"

namespace hora {
namespace {

using testing::count;
using testing::slurp;

std::string tempPath(const char *stem) { return testing::tempPath(std::string("timeline-") + stem + ".json"); }

TEST(Timeline, EachRankWritesItsOwnFile) {
  EXPECT_EQ(Timeline::rankPath("/t/trace.json", 0, 1), "/t/trace.json");
  EXPECT_EQ(Timeline::rankPath("/t/trace.json", 3, 4), "/t/trace.rank3.json");
  EXPECT_EQ(Timeline::rankPath("/t/run{rank}/x.json", 2, 4), "/t/run2/x.json");
  EXPECT_EQ(Timeline::rankPath("/t/trace.{rank}.json", 0, 1), "/t/trace.0.json");
  EXPECT_EQ(Timeline::rankPath("/t.d/trace", 1, 2), "/t.d/trace.rank1");
  EXPECT_EQ(Timeline::rankPath("/t/.hidden", 1, 2), "/t/.hidden.rank1");
}

TEST(Timeline, RecordsBetweenStartAndStopIntoACompleteArray) {
  Timeline tl(TimelineOrigin{0, 1, "host\"1", 42});
  const std::string path = tempPath("a");
  const auto t0 = Timeline::Clock::now();
  tl.tensorPhase(0, "before", "QUEUED", t0, t0);  // not started: dropped
  tl.start(path);
  EXPECT_TRUE(tl.active());
  // A name with a quote, a backslash, a newline and bytes that are not UTF-8.
  const std::string odd = std::string("a\"b\\c\nd\xff\xfe", 9);
  const std::string utf8 = "grad.\xc3\xa9t\xc3\xa9.\xe5\x90\x8d\xe5\x89\x8d.\xf0\x9f\x99\x82";  // é, 名前, an emoji
  tl.tensorPhase(0, odd, "QUEUED", t0, t0 + std::chrono::microseconds(5));
  tl.tensorPhase(3, "w", "NEGOTIATE", t0, t0 + std::chrono::microseconds(7));
  tl.tensorPhase(0, utf8, "QUEUED", t0, t0 + std::chrono::microseconds(5));
  tl.operation(0, "ALLREDUCE", 2, 2'000'000, t0, t0 + std::chrono::milliseconds(1));
  tl.step(0, "COLLECTIVE", t0, t0 + std::chrono::microseconds(900));
  tl.stop();
  EXPECT_FALSE(tl.active());
  tl.tensorPhase(0, "after", "QUEUED", t0, t0);  // stopped: dropped
  tl.stop();                                     // idempotent

  const std::string text = slurp(path);
  ASSERT_GE(text.size(), 4u);
  EXPECT_EQ(text.substr(0, 2), "[\n");
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  EXPECT_EQ(count(text, "\"before\""), 0u);
  EXPECT_EQ(count(text, "\"after\""), 0u);
  // Not UTF-8: U+FFFD each; well-formed UTF-8 stays itself (the file is UTF-8 JSON).
  EXPECT_EQ(count(text, R"("name":"a\"b\\c\u000ad\ufffd\ufffd")"), 1u) << text;
  EXPECT_EQ(count(text, "\"name\":\"" + utf8 + "\""), 1u) << text;
  EXPECT_EQ(count(text, R"x("name":"w (process set 3)")x"), 1u);
  EXPECT_EQ(count(text, R"("host":"host\"1","sync_us":42.000)"), 1u) << text;
  // 2 MB in 1 ms: 2 GB/s.
  EXPECT_EQ(count(text, R"("args":{"tensors":2,"bytes":2000000,"GB/s":2.000})"), 1u) << text;
  EXPECT_EQ(count(text, R"("name":"COLLECTIVE","ph":"X")"), 1u);
  EXPECT_EQ(count(text, R"("dur":900.000)"), 1u);
  EXPECT_EQ(count(text, "\"ph\":\"X\""), 5u);
  unlink(path.c_str());
}

TEST(Timeline, RestartReplacesTheFileAndBadPathsAreRefused) {
  Timeline tl(TimelineOrigin{1, 2, "h", 0});
  const std::string path = tempPath("b");
  const std::string mine = Timeline::rankPath(path, 1, 2);
  const auto t0 = Timeline::Clock::now();
  tl.start(path);
  EXPECT_EQ(tl.path(), mine);
  tl.tensorPhase(0, "first", "QUEUED", t0, t0);
  tl.start(path);  // stops the first run, truncates the file
  tl.tensorPhase(0, "second", "QUEUED", t0, t0);
  tl.stop();
  const std::string text = slurp(mine);
  EXPECT_EQ(count(text, "\"first\""), 0u);
  EXPECT_EQ(count(text, "\"second\""), 1u);
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  unlink(mine.c_str());

  try {
    tl.start("/nonexistent-hora-dir/t.json");
    ADD_FAILURE() << "an unwritable path was accepted";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("/nonexistent-hora-dir/t.rank1.json"), std::string::npos) << e.message();
  }
  EXPECT_FALSE(tl.active());
}

}  // namespace
}  // namespace hora
