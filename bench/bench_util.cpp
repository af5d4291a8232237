// SPDX-License-Identifier: Apache-2.0
// What hora-bench and hora-grads share: command lines, dtypes, reduce ops, test values, output.

#include "bench_util.h"

#include "world.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace hora::bench {

// ---- errors ------------------------------------------------------------------------------------

namespace {
const char *gProgram = "hora-bench";
}  // namespace

void setProgramName(const char *name) { gProgram = name; }

bool usageErrorAnywhere(const std::string &error, int rank) {
  const bool bad = sumOverRanks(static_cast<int64_t>(!error.empty())) != 0;
  if (bad && rank == 0) {
    std::fprintf(stderr, "%s: %s\n", programName(), error.c_str());
    std::fprintf(stderr, "%s: run with --help for the options\n", programName());
  }
  return bad;
}

const char *programName() { return gProgram; }

void failHora(const char *what, hora_status_t status) {
  std::fprintf(stderr, "%s: %s: %s: %s\n", gProgram, what, hora_status_string(status),
               hora_last_error());
  abortJob(2);
}

void failHere(const std::string &message) {
  std::fprintf(stderr, "%s: %s\n", gProgram, message.c_str());
  abortJob(2);
}

// ---- command line ------------------------------------------------------------------------------

bool parseBytes(const char *text, int64_t *out) {
  char *end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno || end == text || !(v >= 0)) return false;
  double mult = 1;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1024.0; ++end; break;
    case 'm': case 'M': mult = 1024.0 * 1024; ++end; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; ++end; break;
    default: return false;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0' || v * mult > 9.0e18) return false;
  *out = static_cast<int64_t>(v * mult);
  return true;
}

bool parseInt(const char *text, int64_t lo, int64_t hi, int64_t *out) {
  char *end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno || end == text || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parseDouble(const char *text, double lo, double hi, double *out) {
  char *end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno || end == text || *end != '\0' || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

ParseResult parseCommandLine(int argc, char **argv, const std::vector<OptionSpec> &specs,
                             std::string *error) {
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "-h" || name == "--help") return ParseResult::kHelp;
    const char *value = nullptr;
    std::string inlineValue;
    const size_t eq = name.find('=');
    if (name.rfind("--", 0) == 0 && eq != std::string::npos) {
      inlineValue = name.substr(eq + 1);
      name.resize(eq);
      value = inlineValue.c_str();
    }
    const OptionSpec *spec = nullptr;
    const bool positional = name.empty() || name[0] != '-';
    for (const OptionSpec &s : specs)
      if (std::find(s.names.begin(), s.names.end(), positional ? "" : name) != s.names.end()) spec = &s;
    if (spec && positional) {
      const std::string why = spec->set(argv[i]);
      if (!why.empty()) {
        *error = "'" + name + "': " + why;
        return ParseResult::kError;
      }
      continue;
    }
    if (!spec) {
      *error = "unknown option " + name + (name.empty() || name[0] != '-' ? " (every option "
               "takes the form -x VALUE or --name VALUE)" : "");
      return ParseResult::kError;
    }
    if (!value) {
      if (i + 1 >= argc) {
        *error = name + " needs a value";
        return ParseResult::kError;
      }
      value = argv[++i];
    }
    const std::string why = spec->set(value);
    if (!why.empty()) {
      *error = "bad value for " + name + ": '" + value + "': " + why;
      return ParseResult::kError;
    }
  }
  return ParseResult::kRun;
}

std::string unwritable(const std::string &file) {
  const size_t slash = file.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  if (access(dir.c_str(), W_OK) != 0)
    return "cannot write " + file + ": " + dir + ": " + std::strerror(errno);
  return "";
}

bool writeReport(const std::string &file, const std::function<void(FILE *)> &write) {
  FILE *f = std::fopen(file.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "%s: cannot write %s: %s\n", programName(), file.c_str(),
                 std::strerror(errno));
    return false;
  }
  write(f);
  std::fclose(f);
  return true;
}

// ---- element types -----------------------------------------------------------------------------

namespace {

const DType kTypes[] = {
    {"float", Kind::kF32, {kDLFloat, 32, 1}, 4, MPI_FLOAT, true},
    {"half", Kind::kF16, {kDLFloat, 16, 1}, 2, MPI_DATATYPE_NULL, true},
    {"bfloat16", Kind::kBF16, {kDLBfloat, 16, 1}, 2, MPI_DATATYPE_NULL, true},
    {"double", Kind::kF64, {kDLFloat, 64, 1}, 8, MPI_DOUBLE, true},
    {"int32", Kind::kI32, {kDLInt, 32, 1}, 4, MPI_INT32_T, false},
    {"int64", Kind::kI64, {kDLInt, 64, 1}, 8, MPI_INT64_T, false},
    {"int8", Kind::kI8, {kDLInt, 8, 1}, 1, MPI_INT8_T, false},
    {"uint8", Kind::kU8, {kDLUInt, 8, 1}, 1, MPI_UINT8_T, false},
};

}  // namespace

const DType *findDType(const std::string &name) {
  for (const DType &t : kTypes)
    if (name == t.name) return &t;
  // nccl-tests' spellings too
  static const std::pair<const char *, const char *> kAliases[] = {
      {"float32", "float"}, {"fp32", "float"},     {"float16", "half"}, {"fp16", "half"},
      {"bf16", "bfloat16"}, {"float64", "double"}, {"fp64", "double"},  {"int", "int32"},
  };
  for (const auto &a : kAliases)
    if (name == a.first) return findDType(a.second);
  return nullptr;
}

std::string dtypeNames() {
  std::string s;
  for (const DType &t : kTypes) s += (s.empty() ? "" : "|") + std::string(t.name);
  return s;
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: renormalise
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while (!(mant & 0x400u));
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // inf, or rounds to it
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23, mant = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value / 2^-24, the half subnormal unit
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t bits = ((absx >> 23) - 112) << 10 | ((absx >> 13) & 0x3ffu);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (bits & 1u))) ++bits;
  return static_cast<uint16_t>(sign | bits);
}

float bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

void storeValue(const DType &t, void *buf, int64_t i, double v) {
  switch (t.kind) {
    case Kind::kF32: static_cast<float *>(buf)[i] = static_cast<float>(v); break;
    case Kind::kF16: static_cast<uint16_t *>(buf)[i] = floatToHalf(static_cast<float>(v)); break;
    case Kind::kBF16: static_cast<uint16_t *>(buf)[i] = floatToBf16(static_cast<float>(v)); break;
    case Kind::kF64: static_cast<double *>(buf)[i] = v; break;
    case Kind::kI32: static_cast<int32_t *>(buf)[i] = static_cast<int32_t>(v); break;
    case Kind::kI64: static_cast<int64_t *>(buf)[i] = static_cast<int64_t>(v); break;
    case Kind::kI8: static_cast<int8_t *>(buf)[i] = static_cast<int8_t>(v); break;
    case Kind::kU8: static_cast<uint8_t *>(buf)[i] = static_cast<uint8_t>(v); break;
  }
}

double loadValue(const DType &t, const void *buf, int64_t i) {
  switch (t.kind) {
    case Kind::kF32: return static_cast<const float *>(buf)[i];
    case Kind::kF16: return halfToFloat(static_cast<const uint16_t *>(buf)[i]);
    case Kind::kBF16: return bf16ToFloat(static_cast<const uint16_t *>(buf)[i]);
    case Kind::kF64: return static_cast<const double *>(buf)[i];
    case Kind::kI32: return static_cast<const int32_t *>(buf)[i];
    case Kind::kI64: return static_cast<double>(static_cast<const int64_t *>(buf)[i]);
    case Kind::kI8: return static_cast<const int8_t *>(buf)[i];
    case Kind::kU8: return static_cast<const uint8_t *>(buf)[i];
  }
  return 0;
}

// ---- reduce ops --------------------------------------------------------------------------------

const ReduceOp *findReduceOp(const std::string &name) {
  static const ReduceOp kOps[] = {
      {"sum", HORA_OP_SUM, MPI_SUM}, {"avg", HORA_OP_AVERAGE, MPI_SUM},
      {"min", HORA_OP_MIN, MPI_MIN}, {"max", HORA_OP_MAX, MPI_MAX},
      {"prod", HORA_OP_PRODUCT, MPI_PROD},
  };
  for (const ReduceOp &o : kOps)
    if (name == o.name) return &o;
  return nullptr;
}

std::string reduceOpNames() { return "sum|avg|min|max|prod"; }

namespace {

// How an element is stored and widened for arithmetic: natively, or 16-bit floats via float.
template <typename T>
struct Native {
  using Storage = T;
  static T widen(T v) { return v; }
  static T narrow(T v) { return v; }
};
struct Half {
  using Storage = uint16_t;
  static float widen(uint16_t v) { return halfToFloat(v); }
  static uint16_t narrow(float v) { return floatToHalf(v); }
};
struct BFloat {
  using Storage = uint16_t;
  static float widen(uint16_t v) { return bf16ToFloat(v); }
  static uint16_t narrow(float v) { return floatToBf16(v); }
};

struct Sum { template <typename T> static T apply(T a, T b) { return a + b; } };
struct Prod { template <typename T> static T apply(T a, T b) { return a * b; } };
struct Min { template <typename T> static T apply(T a, T b) { return b < a ? b : a; } };
struct Max { template <typename T> static T apply(T a, T b) { return a < b ? b : a; } };

template <class Codec, class Op>
void reduceLoop(void *out, const void *a, const void *b, size_t n) {
  using S = typename Codec::Storage;
  auto *o = static_cast<S *>(out);
  const auto *x = static_cast<const S *>(a);
  const auto *y = static_cast<const S *>(b);
  for (size_t i = 0; i < n; ++i)
    o[i] = static_cast<S>(Codec::narrow(Op::apply(Codec::widen(x[i]), Codec::widen(y[i]))));
}

template <class Codec>
ReduceFn forOp(hora_reduce_op_t op) {
  switch (op) {
    case HORA_OP_SUM: case HORA_OP_AVERAGE: return &reduceLoop<Codec, Sum>;
    case HORA_OP_MIN: return &reduceLoop<Codec, Min>;
    case HORA_OP_MAX: return &reduceLoop<Codec, Max>;
    case HORA_OP_PRODUCT: return &reduceLoop<Codec, Prod>;
  }
  return nullptr;
}

// The reduction behind the user MPI op: MPI user functions carry no context.
ReduceFn gMpiUserReduce = nullptr;

void mpiUserOp(void *in, void *inout, int *len, MPI_Datatype *) {
  gMpiUserReduce(inout, in, inout, static_cast<size_t>(*len));
}

}  // namespace

ReduceFn reduceFunction(Kind kind, hora_reduce_op_t op) {
  switch (kind) {
    case Kind::kF32: return forOp<Native<float>>(op);
    case Kind::kF16: return forOp<Half>(op);
    case Kind::kBF16: return forOp<BFloat>(op);
    case Kind::kF64: return forOp<Native<double>>(op);
    case Kind::kI32: return forOp<Native<int32_t>>(op);
    case Kind::kI64: return forOp<Native<int64_t>>(op);
    case Kind::kI8: return forOp<Native<int8_t>>(op);
    case Kind::kU8: return forOp<Native<uint8_t>>(op);
  }
  return nullptr;
}

MpiReduce makeMpiReduce(const DType &t, const ReduceOp &op) {
  MpiReduce r;
  if (t.mpi != MPI_DATATYPE_NULL) {
    r.type = t.mpi;
    r.op = op.mpi;
    return r;
  }
  gMpiUserReduce = reduceFunction(t.kind, op.hora);
  MPI_Op_create(mpiUserOp, /*commute=*/1, &r.op);
  r.type = MPI_UINT16_T;
  r.userOp = true;
  return r;
}

void freeMpiReduce(MpiReduce *r) {
  if (r->userOp) MPI_Op_free(&r->op);
  r->userOp = false;
  r->op = MPI_OP_NULL;
}

// ---- values that verify exactly ----------------------------------------------------------------

double reduceInput(hora_reduce_op_t op, int rank, int n, int64_t j) {
  switch (op) {
    case HORA_OP_AVERAGE: return static_cast<double>(j % 7 + n + 2 * rank - (n - 1));
    case HORA_OP_PRODUCT:  // at most one factor 2 and one 3 per element, the rest 1
      return 1.0 + ((rank + j) % n == 0) + 2.0 * (n > 1 && (rank + j) % n == 1 && j % 2);
    default: return static_cast<double>((rank * 3 + j * 5) % 7 + 1);
  }
}

double reduceExpected(hora_reduce_op_t op, int n, int64_t j) {
  double acc = reduceInput(op, 0, n, j);
  for (int r = 1; r < n; ++r) {
    const double v = reduceInput(op, r, n, j);
    switch (op) {
      case HORA_OP_SUM: case HORA_OP_AVERAGE: acc += v; break;
      case HORA_OP_MIN: acc = std::min(acc, v); break;
      case HORA_OP_MAX: acc = std::max(acc, v); break;
      case HORA_OP_PRODUCT: acc *= v; break;
    }
  }
  return op == HORA_OP_AVERAGE ? acc / n : acc;
}

double patternValue(int64_t a, int64_t b, int64_t j) {
  return static_cast<double>((a * 37 + b * 13 + j * 11 + 3) % 101);
}

// ---- timing ------------------------------------------------------------------------------------

double slowestRank(double local) { return maxOverRanks(local); }

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double mean(const std::vector<double> &v) {
  if (v.empty()) return std::nan("");
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// ---- ranks -------------------------------------------------------------------------------------

std::vector<RankInfo> gatherRanks() {
  struct Raw {
    char host[256];
    int pid;
  } me{};
  gethostname(me.host, sizeof me.host - 1);
  me.pid = static_cast<int>(getpid());
  const std::vector<uint8_t> all = allgatherBytes(&me, sizeof me);
  std::vector<RankInfo> out;
  for (size_t at = 0; at + sizeof me <= all.size(); at += sizeof me) {
    Raw r;
    std::memcpy(&r, all.data() + at, sizeof r);
    r.host[sizeof r.host - 1] = '\0';
    out.push_back({r.host, r.pid});
  }
  return out;
}

void printRanks(FILE *f, const std::vector<RankInfo> &ranks) {
  for (size_t r = 0; r < ranks.size(); ++r)
    std::fprintf(f, "#  Rank %2zu Pid %7d on %10s\n", r, ranks[r].pid, ranks[r].host.c_str());
}

std::string routeAddressTo(const char *host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo *res = nullptr;
  if (getaddrinfo(host, "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    char text[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&me), &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, text, sizeof text) != nullptr)
      out = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

std::string listenAddress(const std::vector<RankInfo> &ranks) {
  bool oneHost = true;
  for (const RankInfo &r : ranks) oneHost = oneHost && r.host == ranks[0].host;
  if (oneHost) return "127.0.0.1";
  if (const char *master = std::getenv("MASTER_ADDR"); master && *master) {
    const std::string a = routeAddressTo(master);
    if (!a.empty()) return a;
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

DLTensor cpuTensor(void *data, DLDataType dtype, int64_t *shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

Buffer::Buffer(size_t bytes) : size_(bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  data_ = static_cast<uint8_t *>(std::aligned_alloc(64, rounded));
  if (!data_) failHere("out of memory allocating " + humanBytes(static_cast<int64_t>(bytes)));
  std::memset(data_, 0, rounded);
}

Buffer::~Buffer() { std::free(data_); }

Buffer::Buffer(Buffer &&other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Buffer &Buffer::operator=(Buffer &&other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---- output ------------------------------------------------------------------------------------

std::string humanBytes(int64_t bytes) {
  static const char *const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (u < 4 && v >= 1024) {
    v /= 1024;
    ++u;
  }
  char b[32];
  std::snprintf(b, sizeof b, v == std::floor(v) ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return b;
}

std::string formatTime(double us) {
  if (std::isnan(us)) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, us < 1e4 ? "%.2f" : us < 1e5 ? "%.1f" : "%.0f", us);
  return b;
}

std::string formatFixed(double v, int decimals) {
  if (std::isnan(v)) return "n/a";
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

void Table::addGroup(const std::string &label, std::vector<Column> columns) {
  groups_.push_back({label, columns_.size(), columns.size()});
  for (Column &c : columns) columns_.push_back(std::move(c));
}

// Cells are aligned in their width, two spaces apart; a right-aligned header name may be up to
// two characters wider than its column and then eats into the gap on its left (nccl-tests'
// " #wrong"). Header lines start with '#'.
std::string Table::line(const std::vector<std::string> &cells, bool header) const {
  std::string out;
  for (size_t i = 0; i < columns_.size(); ++i) {
    const Column &c = columns_[i];
    std::string cell = i < cells.size() ? cells[i] : std::string();
    if (header && i == 0 && c.left) cell = "# " + cell;
    const size_t width = static_cast<size_t>(c.width);
    if (i) out += "  ";
    if (cell.size() < width) {
      if (c.left) cell.append(width - cell.size(), ' ');
      else cell.insert(0, width - cell.size(), ' ');
    } else if (header && i && !c.left) {
      out.resize(out.size() - std::min<size_t>(cell.size() - width, 2));
    }
    out += cell;
  }
  if (header) {
    if (!out.empty()) out[0] = '#';
    out.erase(out.find_last_not_of(' ') + 1);
  }
  return out;
}

void Table::printHeader(FILE *f) const {
  std::vector<std::string> names, units;
  for (const Column &c : columns_) {
    names.push_back(c.name);
    units.push_back(c.unit);
  }
  const std::string nameLine = line(names, true);
  // Each column's right edge, to centre the group labels over their span.
  std::vector<size_t> right;
  size_t pos = 0;
  for (size_t i = 0; i < columns_.size(); ++i) {
    pos += static_cast<size_t>(columns_[i].width) + (i ? 2 : 0);
    right.push_back(pos);
  }
  std::string labels(pos + 1, ' ');
  labels[0] = '#';
  for (const Group &g : groups_) {
    if (g.label.empty() || g.count == 0) continue;
    const size_t lo = g.first ? right[g.first - 1] + 2 : 1, hi = right[g.first + g.count - 1];
    const size_t span = hi - lo;
    const size_t len = std::min(g.label.size(), span);
    const size_t at = lo + (span - len) / 2;
    labels.replace(at, len, g.label.substr(0, len));
  }
  labels.erase(labels.find_last_not_of(' ') + 1);
  std::fprintf(f, "%s\n%s\n%s\n", labels.c_str(), nameLine.c_str(), line(units, true).c_str());
}

void Table::printRow(FILE *f, const std::vector<std::string> &cells) const {
  std::fprintf(f, "%s\n", line(cells, false).c_str());
}

void JsonWriter::separate() {
  if (afterKey_) {
    afterKey_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) std::fputc(',', f_);
    first_.back() = false;
    // Arrays of objects one element per line; everything else on one line.
    std::fputs(first_.size() <= 2 ? "\n" : " ", f_);
    if (first_.size() <= 2) std::fputs(std::string(2 * first_.size(), ' ').c_str(), f_);
  }
}

JsonWriter &JsonWriter::beginObject() {
  separate();
  std::fputc('{', f_);
  first_.push_back(true);
  return *this;
}

JsonWriter &JsonWriter::endObject() {
  first_.pop_back();
  std::fputc('}', f_);
  if (first_.empty()) std::fputc('\n', f_);
  return *this;
}

JsonWriter &JsonWriter::beginArray() {
  separate();
  std::fputc('[', f_);
  first_.push_back(true);
  return *this;
}

JsonWriter &JsonWriter::endArray() {
  first_.pop_back();
  std::fputc(']', f_);
  if (first_.empty()) std::fputc('\n', f_);
  return *this;
}

JsonWriter &JsonWriter::key(const std::string &k) {
  value(k);
  std::fputs(": ", f_);
  afterKey_ = true;
  return *this;
}

JsonWriter &JsonWriter::value(const std::string &v) {
  separate();
  std::fputc('"', f_);
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      std::fputc('\\', f_);
      std::fputc(c, f_);
    } else if (c < 0x20) {
      std::fprintf(f_, "\\u%04x", c);
    } else {
      std::fputc(c, f_);
    }
  }
  std::fputc('"', f_);
  return *this;
}

JsonWriter &JsonWriter::value(double v) {
  if (!std::isfinite(v)) return null();
  separate();
  std::fprintf(f_, "%.6g", v);
  return *this;
}

JsonWriter &JsonWriter::value(int64_t v) {
  separate();
  std::fprintf(f_, "%" PRId64, v);
  return *this;
}

JsonWriter &JsonWriter::value(bool v) {
  separate();
  std::fputs(v ? "true" : "false", f_);
  return *this;
}

JsonWriter &JsonWriter::null() {
  separate();
  std::fputs("null", f_);
  return *this;
}

}  // namespace hora::bench
