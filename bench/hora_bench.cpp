// SPDX-License-Identifier: Apache-2.0
// hora-bench: allreduce bandwidth in the nccl-tests layout, hora against raw MPI_Allreduce.

#include <hora/hora.h>

#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// ---- command line ------------------------------------------------------------------------------

struct Options {
  int64_t minBytes = 32 << 20;
  int64_t maxBytes = 32 << 20;
  double factor = 2.0;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  std::string op = "sum";
  std::string dtype = "float";
  std::string json;
};

void usage(const char *argv0) {
  std::fprintf(stderr,
               "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
               "          [-o sum|avg|min|max|prod] [-d float|half|bfloat16|double|int32|int64|"
               "int8|uint8]\n"
               "          [--json FILE]\n"
               "  sizes in bytes, with an optional K, M or G suffix (powers of 1024);\n"
               "  run under mpirun: every rank runs the same command line\n",
               argv0);
}

bool parseBytes(const char *s, int64_t *out) {
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (errno || end == s || v < 0) return false;
  double mult = 1;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1024.0; ++end; break;
    case 'm': case 'M': mult = 1024.0 * 1024; ++end; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; ++end; break;
    default: return false;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return false;
  *out = static_cast<int64_t>(v * mult);
  return true;
}

bool parseInt(const char *s, int lo, int *out) {
  char *end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > (1L << 30)) return false;
  *out = static_cast<int>(v);
  return true;
}

// Returns 0 to run, 1 after a usage error, 2 after -h.
int parseOptions(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return 2;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "hora-bench: %s needs a value\n", a.c_str());
      return 1;
    }
    const char *v = argv[++i];
    int n = 0;
    bool ok = true;
    if (a == "-b") ok = parseBytes(v, &o->minBytes);
    else if (a == "-e") ok = parseBytes(v, &o->maxBytes);
    else if (a == "-f") ok = (o->factor = std::strtod(v, nullptr)) > 1.0;
    else if (a == "-n") ok = parseInt(v, 1, &o->iters);
    else if (a == "-w") ok = parseInt(v, 0, &o->warmup);
    else if (a == "-c") { ok = parseInt(v, 0, &n) && n <= 1; o->check = n != 0; }
    else if (a == "-o") o->op = v;
    else if (a == "-d") o->dtype = v;
    else if (a == "--json") o->json = v;
    else {
      std::fprintf(stderr, "hora-bench: unknown option %s\n", a.c_str());
      return 1;
    }
    if (!ok) {
      std::fprintf(stderr, "hora-bench: bad value for %s: %s\n", a.c_str(), v);
      return 1;
    }
  }
  if (o->minBytes < 1 || o->maxBytes < o->minBytes) {
    std::fprintf(stderr, "hora-bench: need 1 <= -b <= -e\n");
    return 1;
  }
  return 0;
}

// ---- data types --------------------------------------------------------------------------------

enum class Kind { F32, F16, BF16, F64, I32, I64, I8, U8 };

struct DType {
  const char *name;
  Kind kind;
  DLDataType dl;
  int bytes;
  MPI_Datatype mpi;  // MPI_DATATYPE_NULL for half and bfloat16: set up at run time
  bool isFloat;
};

const DType *findDType(const std::string &name) {
  static const DType kTypes[] = {
      {"float", Kind::F32, {kDLFloat, 32, 1}, 4, MPI_FLOAT, true},
      {"half", Kind::F16, {kDLFloat, 16, 1}, 2, MPI_DATATYPE_NULL, true},
      {"bfloat16", Kind::BF16, {kDLBfloat, 16, 1}, 2, MPI_DATATYPE_NULL, true},
      {"double", Kind::F64, {kDLFloat, 64, 1}, 8, MPI_DOUBLE, true},
      {"int32", Kind::I32, {kDLInt, 32, 1}, 4, MPI_INT32_T, false},
      {"int64", Kind::I64, {kDLInt, 64, 1}, 8, MPI_INT64_T, false},
      {"int8", Kind::I8, {kDLInt, 8, 1}, 1, MPI_INT8_T, false},
      {"uint8", Kind::U8, {kDLUInt, 8, 1}, 1, MPI_UINT8_T, false},
  };
  for (const DType &t : kTypes)
    if (name == t.name) return &t;
  return nullptr;
}

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: renormalise
    int e = -1;
    do { mant <<= 1; ++e; } while (!(mant & 0x400u));
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflows to inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = absx >> 23, mant = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // value / 2^-24, the half subnormal unit
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t bits = ((absx >> 23) - 112) << 10 | ((absx >> 13) & 0x3ffu);
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (bits & 1u))) ++bits;
  return static_cast<uint16_t>(sign | bits);
}

float bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
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

void store(const DType &t, void *buf, int64_t i, double v) {
  switch (t.kind) {
    case Kind::F32: static_cast<float *>(buf)[i] = static_cast<float>(v); break;
    case Kind::F16: static_cast<uint16_t *>(buf)[i] = floatToHalf(static_cast<float>(v)); break;
    case Kind::BF16: static_cast<uint16_t *>(buf)[i] = floatToBf16(static_cast<float>(v)); break;
    case Kind::F64: static_cast<double *>(buf)[i] = v; break;
    case Kind::I32: static_cast<int32_t *>(buf)[i] = static_cast<int32_t>(v); break;
    case Kind::I64: static_cast<int64_t *>(buf)[i] = static_cast<int64_t>(v); break;
    case Kind::I8: static_cast<int8_t *>(buf)[i] = static_cast<int8_t>(v); break;
    case Kind::U8: static_cast<uint8_t *>(buf)[i] = static_cast<uint8_t>(v); break;
  }
}

double load(const DType &t, const void *buf, int64_t i) {
  switch (t.kind) {
    case Kind::F32: return static_cast<const float *>(buf)[i];
    case Kind::F16: return halfToFloat(static_cast<const uint16_t *>(buf)[i]);
    case Kind::BF16: return bf16ToFloat(static_cast<const uint16_t *>(buf)[i]);
    case Kind::F64: return static_cast<const double *>(buf)[i];
    case Kind::I32: return static_cast<const int32_t *>(buf)[i];
    case Kind::I64: return static_cast<double>(static_cast<const int64_t *>(buf)[i]);
    case Kind::I8: return static_cast<const int8_t *>(buf)[i];
    case Kind::U8: return static_cast<const uint8_t *>(buf)[i];
  }
  return 0;
}

// ---- reduce ops --------------------------------------------------------------------------------

struct ReduceOp {
  const char *name;
  hora_reduce_op_t hora;
  MPI_Op mpi;  // avg is timed as MPI_SUM (what a caller of raw MPI would do before scaling)
};

const ReduceOp *findOp(const std::string &name) {
  static const ReduceOp kOps[] = {
      {"sum", HORA_OP_SUM, MPI_SUM},   {"avg", HORA_OP_AVERAGE, MPI_SUM},
      {"min", HORA_OP_MIN, MPI_MIN},   {"max", HORA_OP_MAX, MPI_MAX},
      {"prod", HORA_OP_PRODUCT, MPI_PROD},
  };
  for (const ReduceOp &o : kOps)
    if (name == o.name) return &o;
  return nullptr;
}

// Raw MPI has no half or bfloat16: a user op on 16-bit words, accumulating in float.
Kind g16Kind = Kind::F16;
hora_reduce_op_t g16Op = HORA_OP_SUM;

void reduce16(void *in, void *inout, int *len, MPI_Datatype *) {
  const uint16_t *a = static_cast<const uint16_t *>(in);
  uint16_t *b = static_cast<uint16_t *>(inout);
  const bool half = g16Kind == Kind::F16;
  for (int i = 0; i < *len; ++i) {
    float x = half ? halfToFloat(a[i]) : bf16ToFloat(a[i]);
    float y = half ? halfToFloat(b[i]) : bf16ToFloat(b[i]);
    float r = 0;
    switch (g16Op) {
      case HORA_OP_SUM: case HORA_OP_AVERAGE: r = x + y; break;
      case HORA_OP_MIN: r = std::min(x, y); break;
      case HORA_OP_MAX: r = std::max(x, y); break;
      case HORA_OP_PRODUCT: r = x * y; break;
    }
    b[i] = half ? floatToHalf(r) : floatToBf16(r);
  }
}

// Every rank's input element j, and the exact result: small integers, exact in every dtype
// (bfloat16 included) for the rank counts a 2-core machine runs. For avg the inputs spread
// symmetrically around a base value, so the sum is exactly n times the expected result.
double inputValue(hora_reduce_op_t op, int rank, int n, int64_t j) {
  switch (op) {
    case HORA_OP_AVERAGE: return static_cast<double>(j % 7 + n + 2 * rank - (n - 1));
    case HORA_OP_PRODUCT:  // at most one factor 2 and one 3 per element, the rest 1
      return 1.0 + ((rank + j) % n == 0) + 2.0 * (n > 1 && (rank + j) % n == 1 && j % 2);
    default: return static_cast<double>((rank * 3 + j * 5) % 7 + 1);
  }
}

double expectedValue(hora_reduce_op_t op, int n, int64_t j) {
  double acc = inputValue(op, 0, n, j);
  for (int r = 1; r < n; ++r) {
    double v = inputValue(op, r, n, j);
    switch (op) {
      case HORA_OP_SUM: case HORA_OP_AVERAGE: acc += v; break;
      case HORA_OP_MIN: acc = std::min(acc, v); break;
      case HORA_OP_MAX: acc = std::max(acc, v); break;
      case HORA_OP_PRODUCT: acc *= v; break;
    }
  }
  return op == HORA_OP_AVERAGE ? acc / n : acc;
}

// ---- the benchmark -----------------------------------------------------------------------------

[[noreturn]] void fail(const char *what, hora_status_t st) {
  std::fprintf(stderr, "hora-bench: %s: %s: %s\n", what, hora_status_string(st), hora_last_error());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

struct Group {
  double timeUs = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

struct Row {
  int64_t bytes = 0, count = 0;
  Group outOfPlace, inPlace, mpi;
};

class Bench {
 public:
  Bench(const Options &o, const DType &t, const ReduceOp &op, int rank, int size)
      : opt_(o), type_(t), op_(op), rank_(rank), size_(size) {
    if (t.mpi == MPI_DATATYPE_NULL) {
      g16Kind = t.kind;
      g16Op = op.hora;
      MPI_Op_create(reduce16, 1, &mpiOp_);
      mpiType_ = MPI_UINT16_T;
    } else {
      mpiOp_ = op.mpi;
      mpiType_ = t.mpi;
    }
    const size_t cap = static_cast<size_t>(std::max<int64_t>(o.maxBytes, t.bytes));
    send_.assign(cap, 0);  // touched here, never inside a timed loop
    recv_.assign(cap, 0);
  }
  ~Bench() {
    if (type_.mpi == MPI_DATATYPE_NULL) MPI_Op_free(&mpiOp_);
  }

  Row run(int64_t bytes) {
    Row row;
    row.count = std::max<int64_t>(1, bytes / type_.bytes);
    row.bytes = row.count * type_.bytes;
    count_ = row.count;
    shape_ = row.count;
    name_ = "hora-bench.allreduce." + std::to_string(row.bytes);

    fill(send_.data());
    row.outOfPlace = timeHora(send_.data(), recv_.data());
    row.outOfPlace.wrong = opt_.check ? checkedOp(send_.data(), recv_.data(), false) : 0;

    row.inPlace = timeHora(recv_.data(), recv_.data());  // values drift; checked after a refill
    row.inPlace.wrong = opt_.check ? checkedOp(recv_.data(), recv_.data(), true) : 0;

    fill(send_.data());
    row.mpi = timeMpi();
    for (Group *g : {&row.outOfPlace, &row.inPlace, &row.mpi}) {
      g->algbw = static_cast<double>(row.bytes) / (g->timeUs * 1e3);  // GB/s
      g->busbw = g->algbw * 2.0 * (size_ - 1) / size_;
    }
    int64_t wrong[2] = {row.outOfPlace.wrong, row.inPlace.wrong};
    MPI_Allreduce(MPI_IN_PLACE, wrong, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    row.outOfPlace.wrong = wrong[0];
    row.inPlace.wrong = wrong[1];
    return row;
  }

 private:
  void fill(uint8_t *buf) {
    for (int64_t j = 0; j < count_; ++j)
      store(type_, buf, j, inputValue(op_.hora, rank_, size_, j));
  }

  void horaOp(uint8_t *in, uint8_t *out) {
    DLTensor ti{}, to{};
    ti.data = in;
    ti.device = {kDLCPU, 0};
    ti.ndim = 1;
    ti.dtype = type_.dl;
    ti.shape = &shape_;
    to = ti;
    to.data = out;
    hora_request_t req = nullptr;
    hora_status_t st = hora_allreduce_async(name_.c_str(), &ti, &to, op_.hora, 1.0, 1.0, 0, &req);
    if (st != HORA_SUCCESS) fail("hora_allreduce_async", st);
    st = hora_wait(req);
    if (st != HORA_SUCCESS) fail("hora_wait", st);
    hora_request_free(req);
  }

  // Mean time per op on this rank, then the slowest rank's.
  double slowest(double seconds) {
    double us = seconds * 1e6 / opt_.iters;
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return us;
  }

  Group timeHora(uint8_t *in, uint8_t *out) {
    for (int i = 0; i < opt_.warmup; ++i) horaOp(in, out);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < opt_.iters; ++i) horaOp(in, out);
    Group g;
    g.timeUs = slowest(MPI_Wtime() - t0);
    return g;
  }

  Group timeMpi() {
    auto once = [&] {
      MPI_Allreduce(send_.data(), recv_.data(), static_cast<int>(count_), mpiType_, mpiOp_,
                    MPI_COMM_WORLD);
    };
    for (int i = 0; i < opt_.warmup; ++i) once();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < opt_.iters; ++i) once();
    Group g;
    g.timeUs = slowest(MPI_Wtime() - t0);
    return g;
  }

  int64_t checkedOp(uint8_t *in, uint8_t *out, bool inPlace) {
    fill(in);
    if (!inPlace) std::memset(out, 0xA5, static_cast<size_t>(count_ * type_.bytes));
    horaOp(in, out);
    int64_t wrong = 0;
    for (int64_t j = 0; j < count_; ++j)
      wrong += load(type_, out, j) != expectedValue(op_.hora, size_, j);
    return wrong;
  }

  const Options &opt_;
  const DType &type_;
  const ReduceOp &op_;
  const int rank_, size_;
  MPI_Op mpiOp_ = MPI_OP_NULL;
  MPI_Datatype mpiType_ = MPI_DATATYPE_NULL;
  std::vector<uint8_t> send_, recv_;
  int64_t count_ = 0;
  int64_t shape_ = 0;
  std::string name_;
};

std::string formatTime(double us) {
  char b[32];
  std::snprintf(b, sizeof b, us < 1e4 ? "%7.2f" : us < 1e5 ? "%7.1f" : "%7.0f", us);
  return b;
}

std::string humanBytes(int64_t b) {
  static const char *const kUnits[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + " " + kUnits[u];
}

void writeJson(const std::string &path, const Options &o, int size, const std::vector<Row> &rows) {
  FILE *f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "hora-bench: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return;
  }
  std::fprintf(f,
               "{\"collective\": \"allreduce\", \"ranks\": %d, \"dtype\": \"%s\", \"op\": \"%s\", "
               "\"iters\": %d, \"warmup\": %d, \"check\": %s, \"rows\": [",
               size, o.dtype.c_str(), o.op.c_str(), o.iters, o.warmup, o.check ? "true" : "false");
  auto group = [f](const char *name, const Group &g, bool wrong) {
    std::fprintf(f, "\"%s\": {\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f", name,
                 g.timeUs, g.algbw, g.busbw);
    if (wrong) std::fprintf(f, ", \"wrong\": %" PRId64, g.wrong);
    std::fprintf(f, "}");
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    std::fprintf(f, "%s\n  {\"size\": %" PRId64 ", \"count\": %" PRId64 ", ", i ? "," : "",
                 r.bytes, r.count);
    group("hora_out_of_place", r.outOfPlace, true);
    std::fprintf(f, ", ");
    group("hora_in_place", r.inPlace, true);
    std::fprintf(f, ", ");
    group("mpi", r.mpi, false);
    std::fprintf(f, ", \"hora_over_mpi\": %.4f}", r.mpi.timeUs / r.outOfPlace.timeUs);
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char **argv) {
  // MPI first, with full thread support: hora's engine thread then shares this MPI, and hora
  // leaves finalizing it to us.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  Options opt;
  const int parsed = parseOptions(argc, argv, &opt);
  const DType *type = findDType(opt.dtype);
  const ReduceOp *op = findOp(opt.op);
  int bad = parsed;
  if (!bad && !type) {
    if (rank == 0) std::fprintf(stderr, "hora-bench: unknown dtype %s\n", opt.dtype.c_str());
    bad = 1;
  } else if (!bad && !op) {
    if (rank == 0) std::fprintf(stderr, "hora-bench: unknown op %s\n", opt.op.c_str());
    bad = 1;
  } else if (!bad && op->hora == HORA_OP_AVERAGE && !type->isFloat) {
    if (rank == 0) std::fprintf(stderr, "hora-bench: avg needs a floating-point dtype\n");
    bad = 1;
  }
  if (bad) {
    if (rank == 0) usage(argv[0]);
    MPI_Finalize();
    return bad == 2 ? 0 : 1;
  }
  if (provided < MPI_THREAD_MULTIPLE && rank == 0)
    std::fprintf(stderr, "hora-bench: warning: MPI gives thread level %d, not MULTIPLE\n",
                 provided);

  hora_status_t st = hora_init();
  if (st != HORA_SUCCESS) fail("hora_init", st);
  if (hora_size() != size) {
    std::fprintf(stderr, "hora-bench: hora sees %d ranks, MPI %d\n", hora_size(), size);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  if (rank == 0) {
    std::printf("# hora-bench: allreduce, %d ranks, dtype %s, op %s, %s .. %s x%g, %d iters, "
                "%d warmup, check %s\n",
                size, type->name, op->name, humanBytes(opt.minBytes).c_str(),
                humanBytes(opt.maxBytes).c_str(), opt.factor, opt.iters, opt.warmup,
                opt.check ? "on" : "off");
    std::printf("# time: us per op, the mean over iters of the slowest rank; busbw = algbw x "
                "2(n-1)/n\n");
    std::printf("# MPI_Allreduce: the same buffers, out of place%s; hora/MPI: out-of-place "
                "bandwidth ratio\n",
                op->hora == HORA_OP_AVERAGE ? " (avg timed as MPI_SUM)"
                : type->mpi == MPI_DATATYPE_NULL ? " (user op, float accumulation)" : "");
    std::fflush(stdout);
  }
  // One line per rank, printed by rank 0 (mpirun interleaves the ranks' stdout otherwise).
  struct RankInfo {
    char host[64];
    int pid, localRank, localSize;
  } me{};
  std::vector<RankInfo> infos(rank == 0 ? size : 0);
  gethostname(me.host, sizeof me.host - 1);
  me.pid = static_cast<int>(getpid());
  me.localRank = hora_local_rank();
  me.localSize = hora_local_size();
  MPI_Gather(&me, sizeof me, MPI_BYTE, infos.data(), sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD);

  if (rank == 0) {
    for (int r = 0; r < size; ++r)
      std::printf("#  Rank %2d Pid %6d on %10s (local rank %d of %d)\n", r, infos[r].pid,
                  infos[r].host, infos[r].localRank, infos[r].localSize);
    // Group labels centred over their columns: 52 columns of size..root, then groups of 32,
    // 32 and 26.
    std::string labels(146, ' ');
    labels[0] = '#';
    labels.replace(62, 12, "out-of-place");
    labels.replace(96, 8, "in-place");
    labels.replace(119, 13, "MPI_Allreduce");
    labels.erase(labels.find_last_not_of(' ') + 1);
    std::printf("#\n%s\n", labels.c_str());
    std::printf("#       size         count      type   redop    root     time   algbw   busbw "
                "#wrong     time   algbw   busbw #wrong     time   busbw hora/MPI\n");
    std::printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
                "            (us)  (GB/s)  (GB/s)            (us)  (GB/s)\n");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  {
    Bench bench(opt, *type, *op, rank, size);
    int64_t last = -1;
    for (double b = static_cast<double>(opt.minBytes); b <= static_cast<double>(opt.maxBytes);
         b *= opt.factor) {
      int64_t bytes = static_cast<int64_t>(b);
      if (std::max<int64_t>(1, bytes / type->bytes) * type->bytes == last) continue;
      Row r = bench.run(bytes);
      last = r.bytes;
      rows.push_back(r);
      if (rank == 0) {
        auto wrong = [&](int64_t w) { return opt.check ? std::to_string(w) : std::string("N/A"); };
        std::printf("%12" PRId64 "  %12" PRId64 "  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %5s"
                    "  %7s  %6.2f  %6.2f  %5s  %7s  %6.2f  %7.2f\n",
                    r.bytes, r.count, type->name, op->name, -1,
                    formatTime(r.outOfPlace.timeUs).c_str(), r.outOfPlace.algbw,
                    r.outOfPlace.busbw, wrong(r.outOfPlace.wrong).c_str(),
                    formatTime(r.inPlace.timeUs).c_str(), r.inPlace.algbw, r.inPlace.busbw,
                    wrong(r.inPlace.wrong).c_str(), formatTime(r.mpi.timeUs).c_str(),
                    r.mpi.busbw, r.mpi.timeUs / r.outOfPlace.timeUs);
        std::fflush(stdout);
      }
    }
  }

  int64_t totalWrong = 0;
  double avgBus = 0, avgMpi = 0;
  for (const Row &r : rows) {
    totalWrong += r.outOfPlace.wrong + r.inPlace.wrong;
    avgBus += r.outOfPlace.busbw / rows.size();
    avgMpi += r.mpi.busbw / rows.size();
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %" PRId64 " %s\n", totalWrong,
                !opt.check ? "(not checked)" : totalWrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g\n", avgBus);
    std::printf("# Avg MPI bus bandwidth: %g\n", avgMpi);
    std::printf("#\n");
    std::fflush(stdout);
    if (!opt.json.empty()) writeJson(opt.json, opt, size, rows);
  }

  st = hora_shutdown();
  if (st != HORA_SUCCESS) fail("hora_shutdown", st);
  MPI_Finalize();
  return totalWrong ? 1 : 0;
}
