// SPDX-License-Identifier: Apache-2.0
// The flight recorder's ring and its file; tools/hora-flight-check reads what it writes
// (test/flight).
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "core/flight_recorder.h"
#include "text_files.h"

namespace hora {
namespace {

RequestMsg msg(const std::string &name, int64_t elements) {
  RequestMsg m;
  m.name = name;
  m.op = OpType::kAllreduce;
  m.dtype = DType::kFloat32;
  m.shapes = {{elements}};
  return m;
}

using testing::count;
using testing::tempPath;
using testing::slurp;

TEST(FlightRecorder, KeepsTheLastOperationsWithTheirStates) {
  FlightRecorder fr(4, tempPath("ring.json"), FlightOrigin{1, 2, "hostA"});
  uint64_t ids[6];
  for (int i = 0; i < 6; ++i) {
    ids[i] = fr.submitted(0, msg("t" + std::to_string(i), 10), 40);
    ASSERT_EQ(ids[i], static_cast<uint64_t>(i + 1));
  }
  fr.started(ids[0], 1);  // overwritten by t4: ignored
  fr.started(ids[2], 7);
  fr.finished(ids[2], HORA_SUCCESS);
  fr.started(ids[3], 8);
  fr.finished(ids[3], HORA_ERR_PEER_LOST);
  fr.started(ids[4], 9);
  const std::string json = fr.json("why \"quoted\"");
  EXPECT_EQ(count(json, "\"id\":"), 4u) << json;  // the ring holds 4: t2..t5, oldest first
  EXPECT_EQ(json.find("\"t0\""), std::string::npos);
  EXPECT_EQ(json.find("\"t1\""), std::string::npos);
  EXPECT_LT(json.find("\"t2\""), json.find("\"t5\""));
  EXPECT_NE(json.find("\"seq\":7,\"name\":\"t2\",\"op\":\"allreduce\",\"dtype\":\"float32\","
                      "\"bytes\":40,\"state\":\"done\",\"status\":\"success\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"name\":\"t3\",\"op\":\"allreduce\",\"dtype\":\"float32\",\"bytes\":40,"
                      "\"state\":\"failed\",\"status\":\"peer lost\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"seq\":9,\"name\":\"t4\"") , std::string::npos) << json;
  EXPECT_NE(json.find("\"seq\":-1,\"name\":\"t5\",\"op\":\"allreduce\",\"dtype\":\"float32\","
                      "\"bytes\":40,\"state\":\"submitted\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"rank\":1,\"size\":2,\"host\":\"hostA\""), std::string::npos);
  EXPECT_NE(json.find("\"reason\":\"why \\\"quoted\\\"\""), std::string::npos) << json;
}

TEST(FlightRecorder, RecordsOperationsThisRankNeverSubmitted) {
  FlightRecorder fr(8, tempPath("absent.json"), FlightOrigin{0, 3, "h"});
  fr.absent(0, msg("grad.fc", 4096), 12);
  const std::string json = fr.json("stall");
  EXPECT_NE(json.find("\"seq\":12,\"name\":\"grad.fc\",\"op\":\"allreduce\",\"dtype\":\"float32\","
                      "\"bytes\":16384,\"state\":\"not submitted\",\"status\":\"timeout\","
                      "\"submitted_us\":-1"),
            std::string::npos)
      << json;
}

TEST(FlightRecorder, DumpsToThisRanksFile) {
  const std::string path = tempPath("dump.{rank}.json");
  FlightRecorder fr(16, path, FlightOrigin{3, 4, "h"});
  const std::string mine = tempPath("dump.3.json");
  EXPECT_EQ(fr.path(), mine);
  const uint64_t id = fr.submitted(0, msg(std::string("bad\xff\n", 5), 1), 4);
  fr.finished(id, HORA_ERR_DUPLICATE_NAME);
  EXPECT_EQ(fr.dump("a test"), mine);
  const std::string text = slurp(mine);
  EXPECT_EQ(text.rfind("{\"hora_flight_recorder\":{\"version\":1,\"rank\":3,", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - 4), "]}}\n") << text;
  EXPECT_NE(text.find("\"name\":\"bad\\ufffd\\u000a\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"reason\":\"a test\""), std::string::npos);
  std::remove(mine.c_str());

  FlightRecorder unwritable(16, "/nonexistent-dir/flight.json", FlightOrigin{0, 1, "h"});
  EXPECT_EQ(unwritable.dump("x"), "");  // logged, not thrown
}

// A directory of its own, removed with what is in it.
struct ScratchDir {
  ScratchDir() {
    char pattern[] = "/tmp/hora-prune-XXXXXX";
    path = mkdtemp(pattern);
  }
  ~ScratchDir() {
    for (const std::string &f : files()) std::remove((path + "/" + f).c_str());
    rmdir(path.c_str());
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR *d = opendir(path.c_str())) {
      while (dirent *e = readdir(d)) {
        if (e->d_name[0] != '.') out.push_back(e->d_name);
      }
      closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // A file changed `ageS` seconds ago.
  void touch(const std::string &name, int ageS) const {
    const std::string full = path + "/" + name;
    std::FILE *f = std::fopen(full.c_str(), "w");
    std::fputs("{}", f);
    std::fclose(f);
    const time_t when = time(nullptr) - ageS;
    struct utimbuf times {when, when};
    utime(full.c_str(), &times);
  }
  std::string path;
};

TEST(FlightRecorder, PruneKeepsTheNewestJobsByTheirNewestFile) {
  ScratchDir dir;
  // job "old": two ranks, long ago; "mid": rank 1 recent; "new": one file; a foreign file
  dir.touch("hora-flight.old.0.json", 500);
  dir.touch("hora-flight.old.1.json", 400);
  dir.touch("hora-flight.mid.0.json", 300);
  dir.touch("hora-flight.mid.1.json", 10);
  dir.touch("hora-flight.new.0.json", 100);
  dir.touch("hora-flight.ompi-12.3.4.json", 600);  // job "ompi-12.3", rank 4: oldest
  dir.touch("notes.txt", 900);
  dir.touch("hora-flight.bad job.0.json", 900);  // not a job id: left alone
  const std::string pattern = dir.path + "/hora-flight.{rank}.json";
  EXPECT_EQ(pruneFlightFiles(pattern, "new", 0), 0u);  // 0: keep all
  EXPECT_EQ(pruneFlightFiles(pattern, "new", 2), 3u);  // keeps mid (newest file) and new
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"hora-flight.bad job.0.json",
                                                   "hora-flight.mid.0.json",
                                                   "hora-flight.mid.1.json",
                                                   "hora-flight.new.0.json", "notes.txt"}));
  // The current job is kept even when its files are the oldest.
  dir.touch("hora-flight.new.0.json", 1000);
  EXPECT_EQ(pruneFlightFiles(pattern, "new", 1), 2u);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"hora-flight.bad job.0.json",
                                                   "hora-flight.new.0.json", "notes.txt"}));
  // A pattern without both {job} and {rank} in the name prunes nothing.
  EXPECT_EQ(pruneFlightFiles(dir.path + "/{rank}/flight.json", "new", 1), 0u);
}

TEST(FlightRecorder, WritingAFileRemovesOlderJobs) {
  ScratchDir dir;
  for (int j = 0; j < 5; ++j) dir.touch("flight.job" + std::to_string(j) + ".0.json", 100 + j);
  FlightOrigin origin{0, 2, "h"};
  origin.job = "current";
  FlightRecorder fr(16, dir.path + "/flight.{rank}.json", origin, /*keepJobs=*/3);
  ASSERT_FALSE(fr.dump("a test").empty());
  // this job's file and those of the two jobs with the newest files (job0, job1: oldest ages
  // are the smallest numbers)
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"flight.current.0.json", "flight.job0.0.json",
                                                   "flight.job1.0.json"}));
}

TEST(FlightRecorder, OffRecordsNothing) {
  FlightRecorder off(16, "", FlightOrigin{0, 1, "h"});
  EXPECT_EQ(off.submitted(0, msg("x", 1), 4), 0u);
  off.started(0, 1);
  off.finished(0, HORA_SUCCESS);
  EXPECT_EQ(off.dump("x"), "");
}

}  // namespace
}  // namespace hora
