// SPDX-License-Identifier: Apache-2.0
// Little-endian, length-prefixed encoding of control messages, with a tag and version byte so a
// message of the wrong kind or from another build is rejected rather than misread.
#include "core/message.h"

#include <cstring>
#include <limits>
#include <sstream>

#include "base/error.h"

namespace hora {

std::string Device::str() const {
  if (type == 1) return "cpu";
  if (type == 2) return "cuda:" + std::to_string(id);
  return "device(" + std::to_string(type) + ":" + std::to_string(id) + ")";
}

std::string shapeString(const Shape &shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? "," : "") << shape[i];
  s << ']';
  return s.str();
}

int64_t numElements(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool RequestMsg::operator==(const RequestMsg &o) const {
  return name == o.name && op == o.op && reduceOp == o.reduceOp && dtype == o.dtype &&
         device == o.device && root == o.root && prescale == o.prescale &&
         postscale == o.postscale && shapes == o.shapes && splits == o.splits &&
         joinMode == o.joinMode && rejected == o.rejected;
}

namespace {

constexpr uint8_t kVersion = 3;
constexpr uint8_t kTagRequests = 0x51;
constexpr uint8_t kTagResponses = 0x52;
// Bounds that no legitimate message exceeds; they keep a corrupt length from allocating wildly.
constexpr uint64_t kMaxItems = uint64_t{1} << 24;
constexpr uint64_t kMaxDims = 64;
// The smallest encoded RequestMsg: empty name, no shapes, no splits, no rejection (see
// writeRequest); a response adds at least a status, an empty error and two empty lists (20 bytes).
constexpr size_t kMinRequestBytes = 8 + 3 + 3 * 4 + 2 * 8 + 8 + 8 + 1 + 8;
constexpr uint8_t kMaxJoinMode = HORA_JOIN_ALLREDUCE_ONLY;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void i32(int32_t v) { raw(&v, sizeof v); }
  void i64(int64_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  void str(const std::string &s) {
    u64(s.size());
    out_.append(s);
  }
  std::string take() { return std::move(out_); }

 private:
  void raw(const void *p, size_t n) { out_.append(static_cast<const char *>(p), n); }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string &in) : in_(in) {}
  uint8_t u8() {
    need(1, "byte");
    return static_cast<uint8_t>(in_[pos_++]);
  }
  int32_t i32() { return get<int32_t>("int32"); }
  int64_t i64() { return get<int64_t>("int64"); }
  uint64_t u64() { return get<uint64_t>("uint64"); }
  double f64() { return get<double>("float64"); }
  // A count of items that take at least `each` bytes apiece: more than the rest of the message
  // can hold is refused before anything is allocated for them.
  uint64_t count(uint64_t max, size_t each, const char *what) {
    const uint64_t n = u64();
    if (n > max) fail(what, "count too large");
    if (n > (in_.size() - pos_) / each) fail(what, "count larger than the rest of the message");
    return n;
  }
  std::string str(const char *what) {
    const uint64_t n = u64();
    if (n > in_.size() - pos_) fail(what, "string runs past the end");
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void expectEnd() {
    if (pos_ != in_.size()) fail("message", "trailing bytes");
  }
  [[noreturn]] void fail(const char *what, const char *why) {
    HORA_THROW(HORA_ERR_INTERNAL, "malformed control message: ", what, ": ", why, " (at byte ",
               pos_, " of ", in_.size(), ")");
  }

 private:
  template <typename T>
  T get(const char *what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  void need(size_t n, const char *what) {
    if (n > in_.size() - pos_) fail(what, "truncated");
  }
  const std::string &in_;
  size_t pos_ = 0;
};

void writeRequest(Writer &w, const RequestMsg &r) {
  w.str(r.name);
  w.u8(static_cast<uint8_t>(r.op));
  w.u8(static_cast<uint8_t>(r.reduceOp));
  w.u8(static_cast<uint8_t>(r.dtype));
  w.i32(r.device.type);
  w.i32(r.device.id);
  w.i32(r.root);
  w.f64(r.prescale);
  w.f64(r.postscale);
  w.u64(r.shapes.size());
  for (const Shape &s : r.shapes) {
    w.u64(s.size());
    for (int64_t d : s) w.i64(d);
  }
  w.u64(r.splits.size());
  for (int64_t x : r.splits) w.i64(x);
  w.u8(r.joinMode);
  w.str(r.rejected);
}

RequestMsg readRequest(Reader &r) {
  RequestMsg m;
  m.name = r.str("tensor name");
  const uint8_t op = r.u8();
  if (op >= kNumOpTypes) r.fail("op", "unknown op type");
  m.op = static_cast<OpType>(op);
  const uint8_t red = r.u8();
  if (red >= kNumReduceOps) r.fail("reduce op", "unknown reduce op");
  m.reduceOp = static_cast<ReduceOp>(red);
  const uint8_t dt = r.u8();
  if (!isValidDType(dt)) r.fail("dtype", "unknown dtype");
  m.dtype = static_cast<DType>(dt);
  m.device.type = r.i32();
  m.device.id = r.i32();
  m.root = r.i32();
  m.prescale = r.f64();
  m.postscale = r.f64();
  const uint64_t nshapes = r.count(kMaxItems, 8, "shape list");
  m.shapes.resize(nshapes);
  for (Shape &s : m.shapes) {
    const uint64_t nd = r.count(kMaxDims, 8, "shape");
    s.resize(nd);
    for (int64_t &d : s) {
      d = r.i64();
      if (d < 0) r.fail("shape", "negative dimension");
    }
  }
  const uint64_t nsplits = r.count(kMaxItems, 8, "splits");
  m.splits.resize(nsplits);
  for (int64_t &x : m.splits) x = r.i64();
  m.joinMode = r.u8();
  if (m.joinMode > kMaxJoinMode) r.fail("join mode", "unknown join mode");
  m.rejected = r.str("rejection reason");
  return m;
}

void header(Writer &w, uint8_t tag) {
  w.u8(tag);
  w.u8(kVersion);
}

void checkHeader(Reader &r, uint8_t tag) {
  if (r.u8() != tag) r.fail("header", "wrong message kind");
  if (r.u8() != kVersion) r.fail("header", "wrong protocol version");
}

}  // namespace

std::string encodeRequests(const std::vector<RequestMsg> &requests) {
  Writer w;
  header(w, kTagRequests);
  w.u64(requests.size());
  for (const RequestMsg &r : requests) writeRequest(w, r);
  return w.take();
}

std::vector<RequestMsg> decodeRequests(const std::string &bytes) {
  Reader r(bytes);
  checkHeader(r, kTagRequests);
  const uint64_t n = r.count(kMaxItems, kMinRequestBytes, "request list");
  std::vector<RequestMsg> out;
  out.reserve(std::min<uint64_t>(n, 4096));
  for (uint64_t i = 0; i < n; ++i) out.push_back(readRequest(r));
  r.expectEnd();
  return out;
}

std::string encodeResponses(const std::vector<Response> &responses) {
  Writer w;
  header(w, kTagResponses);
  w.u64(responses.size());
  for (const Response &resp : responses) {
    writeRequest(w, resp.agreed);
    w.i32(static_cast<int32_t>(resp.status));
    w.str(resp.error);
    w.u64(resp.firstDims.size());
    for (int64_t d : resp.firstDims) w.i64(d);
    w.u64(resp.joined.size());
    for (int32_t j : resp.joined) w.i32(j);
  }
  return w.take();
}

std::vector<Response> decodeResponses(const std::string &bytes) {
  Reader r(bytes);
  checkHeader(r, kTagResponses);
  const uint64_t n = r.count(kMaxItems, kMinRequestBytes + 20, "response list");
  std::vector<Response> out;
  out.reserve(std::min<uint64_t>(n, 4096));
  for (uint64_t i = 0; i < n; ++i) {
    Response resp;
    resp.agreed = readRequest(r);
    const int32_t status = r.i32();
    if (status < HORA_SUCCESS || status > HORA_ERR_INTERNAL) r.fail("status", "unknown status");
    resp.status = static_cast<hora_status_t>(status);
    resp.error = r.str("error message");
    const uint64_t nd = r.count(kMaxItems, 8, "first dimensions");
    resp.firstDims.resize(nd);
    for (int64_t &d : resp.firstDims) d = r.i64();
    const uint64_t nj = r.count(kMaxItems, 4, "joined ranks");
    resp.joined.resize(nj);
    for (int32_t &j : resp.joined) j = r.i32();
    out.push_back(std::move(resp));
  }
  r.expectEnd();
  return out;
}

}  // namespace hora
