// SPDX-License-Identifier: Apache-2.0
#include "core/timeline.h"

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/json.h"

namespace hora {
namespace {

constexpr size_t kFlushEvents = 8192;                     // wake the writer early past this
constexpr std::chrono::milliseconds kFlushEvery{200};

void appendMicros(std::string &out, int64_t ns) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
           static_cast<long long>(ns % 1000));
  out += buf;
}

int64_t sinceEpochNs(Timeline::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::string Timeline::rankPath(const std::string &path, int rank, int size) {
  const std::string r = std::to_string(rank);
  if (const size_t at = path.find("{rank}"); at != std::string::npos) {
    return path.substr(0, at) + r + path.substr(at + 6);
  }
  if (size <= 1) return path;
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash + 1)) {
    return path.substr(0, dot) + ".rank" + r + path.substr(dot);
  }
  return path + ".rank" + r;
}

std::string Timeline::path() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return path_;
}

void Timeline::start(const std::string &path) {
  if (path.empty()) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_timeline_start: empty path");
  std::lock_guard<std::mutex> serial(startStop_);
  stopLocked();
  const std::string mine = rankPath(path, origin_.rank, origin_.size);
  FILE *f = fopen(mine.c_str(), "w");
  if (f == nullptr) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_timeline_start: cannot create '", mine,
               "' on rank ", origin_.rank, ": ", std::strerror(errno));
  }
  std::string head = "[\n";
  const std::string pid = std::to_string(origin_.rank);
  head += R"({"name":"process_name","ph":"M","pid":)" + pid + R"(,"args":{"name":"rank )" + pid + "\"}},\n";
  head += R"({"name":"process_sort_index","ph":"M","pid":)" + pid + R"(,"args":{"sort_index":)" + pid + "}},\n";
  head += R"({"name":"hora_clock","ph":"M","pid":)" + pid + R"(,"args":{"rank":)" + pid +
          R"(,"size":)" + std::to_string(origin_.size) + R"(,"host":")";
  appendJsonEscaped(head, origin_.host);
  head += R"(","sync_us":)";
  appendMicros(head, origin_.syncUs * 1000);
  head += "}}";
  fputs(head.c_str(), f);

  std::lock_guard<std::mutex> lock(mutex_);
  file_ = f;  // after the metadata above, every record starts with a comma
  path_ = mine;
  rows_.clear();
  newRows_.clear();
  events_.clear();
  rowLocked(0, "");  // the world's engine row first
  stopping_ = false;
  writer_ = std::thread([this] { writerMain(); });
  active_.store(true);
}

void Timeline::stop() {
  std::lock_guard<std::mutex> serial(startStop_);
  stopLocked();
}

void Timeline::stopLocked() {
  std::thread writer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (file_ == nullptr) return;
    active_.store(false);
    stopping_ = true;
    writer = std::move(writer_);
  }
  wake_.notify_all();
  if (writer.joinable()) writer.join();  // it writes everything recorded before it exits
  std::lock_guard<std::mutex> lock(mutex_);
  fputs("\n]\n", file_);
  fclose(file_);
  file_ = nullptr;
}

uint32_t Timeline::rowLocked(int32_t set, const std::string &label) {
  auto it = rows_.find({set, label});
  if (it != rows_.end()) return it->second;
  const uint32_t row = static_cast<uint32_t>(rows_.size()) + 1;
  rows_.emplace(std::make_pair(set, label), row);
  std::string shown = label.empty() ? "engine" : label;
  if (set != 0) shown += " (process set " + std::to_string(set) + ")";
  newRows_.emplace_back(row, std::move(shown));
  return row;
}

void Timeline::tensorPhase(int32_t set, const std::string &tensor, const char *phase,
                           Clock::time_point begin, Clock::time_point end) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!active_.load(std::memory_order_relaxed)) return;
  // An empty label is the engine row: a tensor with an empty name gets a visible one.
  events_.push_back({rowLocked(set, tensor.empty() ? std::string("(unnamed)") : tensor), phase,
                     sinceEpochNs(begin), sinceEpochNs(end), -1, 0});
  if (events_.size() >= kFlushEvents) wake_.notify_one();
}

void Timeline::operation(int32_t set, const char *op, int tensors, int64_t bytes,
                         Clock::time_point begin, Clock::time_point end, const char *algorithm) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!active_.load(std::memory_order_relaxed)) return;
  events_.push_back({rowLocked(set, ""), op, sinceEpochNs(begin), sinceEpochNs(end), bytes, tensors, algorithm});
  if (events_.size() >= kFlushEvents) wake_.notify_one();
}

void Timeline::step(int32_t set, const char *what, Clock::time_point begin, Clock::time_point end) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!active_.load(std::memory_order_relaxed)) return;
  events_.push_back({rowLocked(set, ""), what, sinceEpochNs(begin), sinceEpochNs(end), -1, 0});
}

void Timeline::writerMain() {
  std::vector<Event> events;
  std::vector<std::pair<uint32_t, std::string>> rows;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, kFlushEvery, [this] { return stopping_ || events_.size() >= kFlushEvents; });
    events.swap(events_);
    rows.swap(newRows_);
    const bool last = stopping_;
    lock.unlock();
    flush(events, rows);
    events.clear();
    rows.clear();
    lock.lock();
    if (last && events_.empty()) return;
  }
}

// Writer thread only (file_ is not replaced while the writer runs).
void Timeline::flush(std::vector<Event> &events, std::vector<std::pair<uint32_t, std::string>> &rows) {
  if (events.empty() && rows.empty()) return;
  const std::string pid = std::to_string(origin_.rank);
  std::string out;
  out.reserve(events.size() * 120 + rows.size() * 100);
  for (const auto &[row, label] : rows) {
    out += ",\n";
    out += R"({"name":"thread_name","ph":"M","pid":)" + pid + R"(,"tid":)" + std::to_string(row) +
           R"(,"args":{"name":")";
    appendJsonEscaped(out, label);
    out += "\"}}";
  }
  for (const Event &e : events) {
    out += ",\n{\"name\":\"";
    out += e.name;
    out += "\",\"ph\":\"X\",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.row) + ",\"ts\":";
    appendMicros(out, e.beginNs);
    out += ",\"dur\":";
    appendMicros(out, std::max<int64_t>(0, e.endNs - e.beginNs));
    if (e.bytes >= 0) {
      const double seconds = static_cast<double>(std::max<int64_t>(1, e.endNs - e.beginNs)) * 1e-9;
      char args[192];
      snprintf(args, sizeof args, ",\"args\":{\"tensors\":%d,\"bytes\":%lld,\"GB/s\":%.3f%s%s%s}", e.tensors,
               static_cast<long long>(e.bytes), static_cast<double>(e.bytes) / seconds * 1e-9,
               e.algorithm ? ",\"algorithm\":\"" : "", e.algorithm ? e.algorithm : "", e.algorithm ? "\"" : "");
      out += args;
    }
    out += '}';
  }
  fwrite(out.data(), 1, out.size(), file_);
  fflush(file_);
}

}  // namespace hora
