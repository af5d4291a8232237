// SPDX-License-Identifier: Apache-2.0
// What hora-bench and hora-grads share: command lines, dtypes, reduce ops, test values, output.
#pragma once

#include <hora/hora.h>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace hora::bench {

// ---- errors ------------------------------------------------------------------------------------

// "hora-bench" or "hora-grads": the prefix of every message.
void setProgramName(const char *name);
const char *programName();

// Prints "<program>: <what>: <status class>: <hora_last_error()>" and aborts every rank.
[[noreturn]] void failHora(const char *what, hora_status_t status);
inline void checkHora(hora_status_t status, const char *what) {
  if (status != HORA_SUCCESS) failHora(what, status);
}
// Prints "<program>: <message>" and aborts every rank.
[[noreturn]] void failHere(const std::string &message);

// ---- command line ------------------------------------------------------------------------------

// "64M", "4K", "1.5G", "512" (bytes; K/M/G are powers of 1024, an optional trailing B).
bool parseBytes(const char *text, int64_t *out);
bool parseInt(const char *text, int64_t lo, int64_t hi, int64_t *out);
bool parseDouble(const char *text, double lo, double hi, double *out);

// One option with a value: every name it answers to ("-b", "--minbytes") and what it does with
// the value. set returns "" when the value is good, else the reason it is not.
struct OptionSpec {
  // "-x" and "--name" spellings; "" takes a positional argument (a word without a dash).
  std::vector<std::string> names;
  std::function<std::string(const char *value)> set;
};

enum class ParseResult { kRun, kHelp, kError };

// Walks argv: "-x VALUE", "--long VALUE" and "--long=VALUE"; -h and --help ask for help. On
// kError *error says what was wrong (the caller prints it on one rank).
ParseResult parseCommandLine(int argc, char **argv, const std::vector<OptionSpec> &specs,
                             std::string *error);

// "" when FILE's directory exists and takes new files, else why not: checked before a long run
// rather than after it.
std::string unwritable(const std::string &file);
// Writes FILE through `write` (the --json report); false, having said why on stderr, when FILE
// cannot be opened.
bool writeReport(const std::string &file, const std::function<void(FILE *)> &write);
// Collective: true on every rank when any rank's `error` is set; rank 0 prints its own with a
// pointer to --help.
bool usageErrorAnywhere(const std::string &error, int rank);

// ---- element types -----------------------------------------------------------------------------

enum class Kind { kF32, kF16, kBF16, kF64, kI32, kI64, kI8, kU8 };

struct DType {
  const char *name;
  Kind kind;
  DLDataType dl;
  int bytes;
  MPI_Datatype mpi;  // MPI_DATATYPE_NULL for half and bfloat16: raw MPI has no such type
  bool isFloat;
};

const DType *findDType(const std::string &name);
std::string dtypeNames();  // "float|half|..." for usage lines

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);  // round to nearest even
float bf16ToFloat(uint16_t b);
uint16_t floatToBf16(float f);  // round to nearest even

void storeValue(const DType &t, void *buf, int64_t i, double v);
double loadValue(const DType &t, const void *buf, int64_t i);

// ---- reduce ops --------------------------------------------------------------------------------

struct ReduceOp {
  const char *name;
  hora_reduce_op_t hora;
  MPI_Op mpi;  // avg: MPI_SUM (a raw MPI or Gloo user sums, then scales)
};

const ReduceOp *findReduceOp(const std::string &name);
std::string reduceOpNames();

// out[i] = a[i] op b[i] for n elements (out may alias a or b); avg reduces as sum. 16-bit floats
// reduce in float and round once, as hora does. The signature of Gloo's reduce functions.
using ReduceFn = void (*)(void *out, const void *a, const void *b, size_t n);
ReduceFn reduceFunction(Kind kind, hora_reduce_op_t op);

// The MPI datatype and op that reduce `t` with `op` through raw MPI: the native pair, or for
// half and bfloat16 a user op over 16-bit words (one at a time per process). Free the op with
// freeMpiReduceOp.
struct MpiReduce {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  bool userOp = false;
};
MpiReduce makeMpiReduce(const DType &t, const ReduceOp &op);
void freeMpiReduce(MpiReduce *r);

// ---- values that verify exactly ----------------------------------------------------------------

// Rank `rank`'s input element j of a reduction over n ranks, and the exact result. Small integers:
// exact in every dtype (bfloat16 and int8 included) for the rank counts a small machine runs. For
// avg the inputs spread symmetrically around a base value, so the sum is n times the average.
double reduceInput(hora_reduce_op_t op, int rank, int n, int64_t j);
double reduceExpected(hora_reduce_op_t op, int n, int64_t j);
// A value that names its origin (rank, block, element) well enough that a misplaced block shows:
// an integer in [0, 100].
double patternValue(int64_t a, int64_t b, int64_t j);

// ---- timing ------------------------------------------------------------------------------------

// The slowest rank's value (the MAX over the world: world.h).
double slowestRank(double local);
double median(std::vector<double> v);
double mean(const std::vector<double> &v);  // NaN when empty

// ---- ranks -------------------------------------------------------------------------------------

struct RankInfo {
  std::string host;
  int pid = 0;
};
// Collective: every rank's host name and pid (on every rank).
std::vector<RankInfo> gatherRanks();
// One "#  Rank  r Pid p on host" line per rank, nccl-tests style. Call on one rank.
void printRanks(FILE *f, const std::vector<RankInfo> &ranks);
// The local IPv4 address that routes to `host` (a connected UDP socket's own address; no packet
// is sent), "" if there is none.
std::string routeAddressTo(const char *host);
// The address this rank's benchmark sockets listen on: loopback where every rank is on one host,
// else the address that routes to MASTER_ADDR, else the host name.
std::string listenAddress(const std::vector<RankInfo> &ranks);

// A 1-D CPU tensor of `*shape` elements (shape must outlive the tensor's use).
DLTensor cpuTensor(void *data, DLDataType dtype, int64_t *shape);

// 64-byte aligned bytes, zeroed at allocation so that no page fault lands inside a timed loop.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);
  ~Buffer();
  Buffer(Buffer &&other) noexcept;
  Buffer &operator=(Buffer &&other) noexcept;
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  uint8_t *data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t *data_ = nullptr;
  size_t size_ = 0;
};

// ---- output ------------------------------------------------------------------------------------

std::string humanBytes(int64_t bytes);  // "64 MiB", "4 KiB", "12 B"
std::string formatTime(double us);      // nccl-tests' time column: fewer decimals as it grows
std::string formatFixed(double v, int decimals);  // "n/a" for NaN

// A fixed-width table in the nccl-tests layout: right-aligned cells two spaces apart, header
// lines starting with '#', and group labels ("out-of-place") centred over their columns.
class Table {
 public:
  struct Column {
    std::string name;
    std::string unit;  // second header line, e.g. "(GB/s)"
    int width;
    bool left = false;  // left-aligned (names); numbers are right-aligned
  };
  void addGroup(const std::string &label, std::vector<Column> columns);
  size_t columnCount() const { return columns_.size(); }
  void printHeader(FILE *f) const;
  void printRow(FILE *f, const std::vector<std::string> &cells) const;

 private:
  std::string line(const std::vector<std::string> &cells, bool header) const;
  struct Group {
    std::string label;
    size_t first, count;
  };
  std::vector<Column> columns_;
  std::vector<Group> groups_;
};

// A streaming JSON writer: objects and arrays nest, commas are placed for the caller, NaN and
// infinities become null.
class JsonWriter {
 public:
  explicit JsonWriter(FILE *f) : f_(f) {}
  JsonWriter &beginObject();
  JsonWriter &endObject();
  JsonWriter &beginArray();
  JsonWriter &endArray();
  JsonWriter &key(const std::string &k);
  JsonWriter &value(const std::string &v);
  JsonWriter &value(const char *v) { return value(std::string(v)); }
  JsonWriter &value(double v);
  JsonWriter &value(int64_t v);
  JsonWriter &value(int v) { return value(static_cast<int64_t>(v)); }
  JsonWriter &value(bool v);
  JsonWriter &null();
  // key(k).value(v)
  template <typename T>
  JsonWriter &field(const std::string &k, const T &v) {
    return key(k).value(v);
  }

 private:
  void separate();
  FILE *f_;
  std::vector<bool> first_;  // per open container: nothing written into it yet
  bool afterKey_ = false;
};

}  // namespace hora::bench
