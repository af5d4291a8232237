// SPDX-License-Identifier: Apache-2.0
// hora-bench: collective bandwidth in the nccl-tests layout, hora against raw MPI, Gloo and memcpy.

#include "bench_util.h"
#include "bench_cuda.h"

#include <hora/hora.h>

#include <mpi.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#if HORA_BENCH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace hora::bench {
namespace {

constexpr int64_t kColdPassMaxBytes = 1 << 20;  // first size up to this: one untimed pass first
constexpr long kDefaultCacheCapacity = 1024;  // HORA_CACHE_CAPACITY's documented default

// ---- collectives -------------------------------------------------------------------------------

enum class Coll { kAllreduce, kAllgather, kBroadcast, kReducescatter, kAlltoall };

struct CollInfo {
  const char *name;  // --op
  Coll coll;
  const char *mpiCall;
  const char *glooCall;
  bool reduces;         // takes -o
  bool blocks;          // the size is n blocks of `count` elements
  bool horaOutOfPlace;  // hora has this form (allgather, reducescatter and alltoall outputs are
  bool horaInPlace;     // allocated by hora: out of place only; broadcast is in place only)
};

const CollInfo kColls[] = {
    {"allreduce", Coll::kAllreduce, "MPI_Allreduce", "gloo::allreduce", true, false, true, true},
    {"allgather", Coll::kAllgather, "MPI_Allgather", "gloo::allgather", false, true, true, false},
    {"broadcast", Coll::kBroadcast, "MPI_Bcast", "gloo::broadcast", false, false, false, true},
    {"reducescatter", Coll::kReducescatter, "MPI_Reduce_scatter_block",
     "gloo::allreduce, then keep this rank's block", true, true, true, false},
    {"alltoall", Coll::kAlltoall, "MPI_Alltoall", "gloo::alltoall", false, true, true, false},
};

const CollInfo *findColl(const std::string &name) {
  for (const CollInfo &c : kColls)
    if (name == c.name) return &c;
  return nullptr;
}

// nccl-tests' bus bandwidth factors (its doc/PERFORMANCE.md): what each rank's links must carry
// relative to the size, so that busbw compares with the hardware's peak whatever the rank count.
double busFactor(Coll c, int n) {
  switch (c) {
    case Coll::kAllreduce: return 2.0 * (n - 1) / n;
    case Coll::kBroadcast: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}

// One row's element counts. `count` is what the count column prints, as nccl-tests does: the
// whole buffer for allreduce and broadcast; one rank's block for the others (allgather: what each
// rank sends; reducescatter: what each rank receives; alltoall: what each rank sends each peer).
struct Shape {
  int64_t count = 0, sendElems = 0, recvElems = 0, bytes = 0;
};

Shape shapeFor(const CollInfo &c, int64_t requested, int esize, int n) {
  Shape s;
  s.count = std::max<int64_t>(1, requested / (esize * (c.blocks ? n : 1)));
  const int64_t all = s.count * (c.blocks ? n : 1);
  switch (c.coll) {
    case Coll::kAllreduce: case Coll::kBroadcast: s.sendElems = s.recvElems = s.count; break;
    case Coll::kAllgather: s.sendElems = s.count; s.recvElems = all; break;
    case Coll::kReducescatter: s.sendElems = all; s.recvElems = s.count; break;
    case Coll::kAlltoall: s.sendElems = s.recvElems = all; break;
  }
  s.bytes = all * esize;
  return s;
}

// ---- command line ------------------------------------------------------------------------------

struct Options {
  int64_t minBytes = 32 << 20;
  int64_t maxBytes = 32 << 20;
  double factor = 2.0;
  int iters = 20;
  int warmup = 5;
  int trials = 1;
  bool check = true;
  bool blocking = false;
  int root = 0;
  std::string coll = "allreduce";
  std::string redop = "sum";
  std::string dtype = "float";
  bool mpi = true, gloo = true, memcpy = true;
  std::string device = "cpu";  // cpu, or cuda (--device cuda: tensors on the GPU, raw NCCL column)
  std::string json, plot;
};

void usage(FILE *f) {
  std::fprintf(
      f,
      "usage: mpirun -np N hora-bench [--op allreduce|allgather|broadcast|reducescatter|alltoall]\n"
      "         [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [--trials T] [-c 0|1]\n"
      "         [-o %s] [-d %s]\n"
      "         [-r ROOT] [--blocking 0|1] [--mpi 0|1] [--gloo 0|1] [--memcpy 0|1]\n"
      "         [--json FILE] [--plot FILE.png]\n"
      "\n"
      "Every rank runs the same command line. nccl-tests' options and table:\n"
      "  -b, --minbytes   smallest size (default 32M); K, M, G suffixes are powers of 1024\n"
      "  -e, --maxbytes   largest size (default 32M)\n"
      "  -f, --stepfactor multiply the size by this from -b up to -e (default 2)\n"
      "  -n, --iters      timed iterations per size (default 20)\n"
      "  -w, --warmup_iters  untimed iterations before them, run the same way (default 5)\n"
      "  --trials T       time the -n iterations T times over and report the median (default 1,\n"
      "                   nccl-tests' one timed loop); small sizes take microseconds, so one\n"
      "                   preempted thread decides a single loop's figure\n"
      "  -c, --check      verify results, counted in #wrong (default 1); never timed\n"
      "  -o, --redop      reduction of allreduce and reducescatter (default sum)\n"
      "  -d, --datatype   element type (default float)\n"
      "  -r, --root       broadcast root (default 0)\n"
      "  --op             the collective (default allreduce)\n"
      "  --blocking 1     latency mode: wait for each hora op before submitting the next\n"
      "  --mpi/--gloo/--memcpy 0   drop that column (all on by default; Gloo only where built)\n"
      "  --device cuda    tensors on the GPU (local rank modulo the GPUs seen), hora on NCCL, and\n"
      "                   a raw NCCL column on the same buffers instead of MPI, Gloo and memcpy\n"
      "                   (builds with NCCL only)\n"
      "  --json FILE      every row, every column, as JSON (written by rank 0)\n"
      "  --plot FILE.png  busbw against size, drawn by gnuplot (package gnuplot-nox) on rank 0\n"
      "\n"
      "Sizes (nccl-tests' conventions): allreduce and broadcast: the buffer; allgather: the bytes\n"
      "each rank receives (it sends size/N); reducescatter: the whole input (each rank receives\n"
      "size/N); alltoall: the bytes each rank sends in all. count is the buffer's elements for\n"
      "allreduce and broadcast, one rank's block for the others.\n"
      "busbw = algbw x 2(N-1)/N for allreduce, (N-1)/N for allgather, reducescatter and alltoall,\n"
      "1 for broadcast; algbw = size / time.\n"
      "\n"
      "Timing. hora, like nccl-tests (which launches -n collectives back to back and synchronises\n"
      "once): -n ops submitted asynchronously, each under its own name (bench.<op>.<bytes>.<i>;\n"
      "hora may fuse them, which is its job), then one wait for all; time = total / n. The -w\n"
      "warm-up ops run the same way first, in batches of at most -n under the same names (hora\n"
      "caches negotiation by name); hora's warm-up is at least 2 x -n ops, as a name's first op\n"
      "goes through the coordinator and only its second through the response cache that every\n"
      "later step uses (past HORA_CACHE_CAPACITY names, every op negotiates afresh: the table\n"
      "says so). --blocking 1 waits for each op before submitting the next, all under one name\n"
      "(latency). Raw MPI, Gloo and memcpy: blocking calls in a loop (what a user of MPI or\n"
      "Gloo writes), the same buffers.\n"
      "Every time is the slowest rank's: an MPI_Barrier, the loop, then the MAX over ranks;\n"
      "with --trials T, that T times over (one warm-up) and the median.\n"
      "When the first size is at most 1 MiB, its whole row runs once untimed before the table:\n"
      "a process's first ops are cold.\n"
      "memcpy: every rank copies size bytes at the same time; its GB/s is the copy bound.\n"
      "The ratio columns compare algbw: hora (out of place; broadcast: in place) over the others.\n"
      "\n"
      "Forms: hora's allgather, reducescatter and alltoall return outputs that hora allocates, so\n"
      "they have no in-place form (n/a); hora's broadcast is in place only, so it has no\n"
      "out-of-place one. avg runs as a sum through MPI and Gloo (a raw user scales afterwards);\n"
      "half and bfloat16 go through MPI as a user op on 16-bit words. Gloo's reducescatter column\n"
      "is an allreduce that keeps this rank's block (this Gloo has no general reduce-scatter).\n"
      "In non-blocking mode the -n outputs that hora allocates are alive together.\n",
      reduceOpNames().c_str(), dtypeNames().c_str());
}

std::vector<OptionSpec> optionSpecs(Options *o) {
  auto bytes = [](int64_t *dst) {
    return [dst](const char *v) { return parseBytes(v, dst) ? "" : "expected bytes, e.g. 64K"; };
  };
  auto integer = [](int *dst, int64_t lo) {
    return [dst, lo](const char *v) -> std::string {
      int64_t n = 0;
      if (!parseInt(v, lo, INT_MAX, &n)) return "expected an integer >= " + std::to_string(lo);
      *dst = static_cast<int>(n);
      return "";
    };
  };
  auto flag = [](bool *dst) {
    return [dst](const char *v) -> std::string {
      int64_t n = 0;
      if (!parseInt(v, 0, 1, &n)) return "expected 0 or 1";
      *dst = n != 0;
      return "";
    };
  };
  auto text = [](std::string *dst) {
    return [dst](const char *v) -> std::string {
      if (!*v) return "empty";
      *dst = v;
      return "";
    };
  };
  return {
      {{"-b", "--minbytes"}, bytes(&o->minBytes)},
      {{"-e", "--maxbytes"}, bytes(&o->maxBytes)},
      {{"-f", "--stepfactor"},
       [o](const char *v) -> std::string {
         return parseDouble(v, 1.0 + 1e-9, 1e9, &o->factor) ? "" : "expected a number > 1";
       }},
      {{"-n", "--iters"}, integer(&o->iters, 1)},
      {{"-w", "--warmup_iters"}, integer(&o->warmup, 0)},
      {{"--trials"}, integer(&o->trials, 1)},
      {{"-c", "--check"}, flag(&o->check)},
      {{"-o", "--redop"}, text(&o->redop)},
      {{"-d", "--datatype"}, text(&o->dtype)},
      {{"-r", "--root"}, integer(&o->root, 0)},
      {{"--op"}, text(&o->coll)},
      {{"--blocking"}, flag(&o->blocking)},
      {{"--mpi"}, flag(&o->mpi)},
      {{"--gloo"}, flag(&o->gloo)},
      {{"--memcpy"}, flag(&o->memcpy)},
      {{"--device"}, text(&o->device)},
      {{"--json"}, text(&o->json)},
      {{"--plot"}, text(&o->plot)},
  };
}

bool inPath(const char *program) {
  const char *path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    if (dir.empty()) dir = ".";
    if (access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// ---- Gloo --------------------------------------------------------------------------------------

#if HORA_BENCH_GLOO
// Gloo's own collectives over its own TCP mesh, as a Gloo user would call them: a baseline for
// what another CPU library does on this machine. Its context rendezvouses through a FileStore in
// a directory of one host's /tmp, so it only runs when every rank shares that host.
class Gloo {
 public:
  static std::unique_ptr<Gloo> connect(int rank, const std::vector<RankInfo> &ranks,
                                       std::string *whyNot) {
    for (const RankInfo &r : ranks) {
      if (r.host != ranks[0].host) {
        *whyNot = "the ranks run on more than one host (" + ranks[0].host + ", " + r.host +
                  "), and its FileStore rendezvous needs one shared directory";
        return nullptr;
      }
    }
    char dir[512] = {0};
    int ok = 1;
    if (rank == 0) {
      const char *tmp = std::getenv("TMPDIR");
      std::snprintf(dir, sizeof dir, "%s/hora-bench-gloo-XXXXXX", tmp && *tmp ? tmp : "/tmp");
      if (!mkdtemp(dir)) {
        ok = 0;
        const std::string why = std::string("mkdtemp(") + dir + "): " + std::strerror(errno);
        std::snprintf(dir, sizeof dir, "%s", why.c_str());
      }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!ok) {
      *whyNot = dir;
      return nullptr;
    }
    auto gloo = std::unique_ptr<Gloo>(new Gloo);
    std::string error;
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";  // one host: loopback
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, static_cast<int>(ranks.size()));
      context->setTimeout(kTimeout);
      gloo::rendezvous::FileStore store(dir);
      context->connectFullMesh(store, device);
      gloo->context_ = context;
    } catch (const std::exception &e) {
      error = e.what();
    }
    int connected = error.empty();
    MPI_Allreduce(MPI_IN_PLACE, &connected, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    // Every rank is past the rendezvous: the store's files have done their work.
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    if (!connected) {
      *whyNot = error.empty() ? "connecting its mesh failed on another rank"
                              : "connecting its mesh failed: " + error;
      return nullptr;
    }
    return gloo;
  }

  void allreduce(const void *in, void *out, int64_t count, int esize, ReduceFn fn) {
    switch (esize) {
      case 1: allreduceAs<uint8_t>(in, out, count, fn); break;
      case 2: allreduceAs<uint16_t>(in, out, count, fn); break;
      case 4: allreduceAs<uint32_t>(in, out, count, fn); break;
      default: allreduceAs<uint64_t>(in, out, count, fn); break;
    }
  }

  void allgather(const void *in, void *out, int64_t bytesPerRank) {
    call("gloo::allgather", [&] {
      gloo::AllgatherOptions o(context_);
      o.setInput(bytePtr(in), static_cast<size_t>(bytesPerRank));
      o.setOutput(static_cast<uint8_t *>(out), static_cast<size_t>(bytesPerRank) * context_->size);
      o.setTag(nextTag());
      o.setTimeout(kTimeout);
      gloo::allgather(o);
    });
  }

  void broadcast(void *buf, int64_t bytes, int root) {
    call("gloo::broadcast", [&] {
      gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<uint8_t *>(buf), static_cast<size_t>(bytes));
      o.setRoot(root);
      o.setTag(nextTag());
      o.setTimeout(kTimeout);
      gloo::broadcast(o);
    });
  }

  void alltoall(const void *in, void *out, int64_t bytes) {
    call("gloo::alltoall", [&] {
      gloo::AlltoallOptions o(context_);
      o.setInput(bytePtr(in), static_cast<size_t>(bytes));
      o.setOutput(static_cast<uint8_t *>(out), static_cast<size_t>(bytes));
      o.setTag(nextTag());
      o.setTimeout(kTimeout);
      gloo::alltoall(o);
    });
  }

 private:
  static constexpr std::chrono::milliseconds kTimeout{600 * 1000};

  Gloo() = default;

  static uint8_t *bytePtr(const void *p) { return static_cast<uint8_t *>(const_cast<void *>(p)); }

  uint32_t nextTag() { return tag_++ & 0xffffffu; }

  template <typename F>
  void call(const char *what, F &&f) {
    try {
      f();
    } catch (const std::exception &e) {
      failHere(std::string(what) + " failed: " + e.what());
    }
  }

  template <typename T>
  void allreduceAs(const void *in, void *out, int64_t count, ReduceFn fn) {
    call("gloo::allreduce", [&] {
      gloo::AllreduceOptions o(context_);
      o.setInput(static_cast<T *>(const_cast<void *>(in)), static_cast<size_t>(count));
      o.setOutput(static_cast<T *>(out), static_cast<size_t>(count));
      o.setReduceFunction(fn);
      o.setTag(nextTag());
      o.setTimeout(kTimeout);
      gloo::allreduce(o);
    });
  }

  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
};
#else
// Built without Gloo: the column is never shown.
class Gloo {
 public:
  void allreduce(const void *, void *, int64_t, int, ReduceFn) {}
  void allgather(const void *, void *, int64_t) {}
  void broadcast(void *, int64_t, int) {}
  void alltoall(const void *, void *, int64_t) {}
};
#endif

// ---- the benchmark -----------------------------------------------------------------------------

struct Timing {
  bool ran = false;
  double timeUs = std::nan(""), algbw = std::nan(""), busbw = std::nan("");
  std::vector<double> trialsUs;  // each timed loop's mean per op; timeUs is their median
  int64_t wrong = 0;  // summed over ranks; only when checked
};

struct Row {
  Shape shape;
  Timing outOfPlace, inPlace, mpi, gloo, memcpy;  // memcpy: algbw is its GB/s
  Timing nccl;                                    // --device cuda: raw NCCL
  const Timing &hora() const { return outOfPlace.ran ? outOfPlace : inPlace; }
};

// One row: every column timed on the same two buffers, then verified.
//
// Timing methodology (the --help text says the same). hora is timed the way nccl-tests times
// NCCL, which launches -n collectives back to back on a stream and synchronises once: -n async
// ops, each under its own name (hora matches ops across ranks by name), then a wait for each;
// whether hora fuses them is the runtime's business, and part of what is measured. --blocking 1
// waits for each op before the next instead (latency mode). Raw MPI and Gloo are timed as their
// users call them: blocking calls in a loop. The memcpy bound: every rank copying `size` bytes at
// the same moment, which on one host shares the memory bus just as the collectives do. Every
// column: -w warm-up ops first, an MPI_Barrier, the timed ops, then the slowest rank's elapsed
// time (MPI_Allreduce MAX) divided by -n. Verification runs afterwards, never inside a timed
// loop.
class Bench {
 public:
  Bench(const Options &o, const CollInfo &c, const DType &t, const ReduceOp &op, int rank, int n,
        size_t capacity, Gloo *gloo, CudaSide *cuda)
      : opt_(o), coll_(c), type_(t), op_(op), rank_(rank), n_(n), gloo_(gloo), cuda_(cuda),
        send_(capacity), recv_(capacity) {
    if (o.mpi) mpiReduce_ = makeMpiReduce(t, op);
    if (t.mpi == MPI_DATATYPE_NULL) mpiReduce_.type = MPI_UINT16_T;  // data movement: 16-bit words
    glooReduce_ = reduceFunction(t.kind, op.hora);
  }
  ~Bench() { freeMpiReduce(&mpiReduce_); }

  Row run(const Shape &shape) {
    shape_ = shape;
    sendShape_ = shape.sendElems;
    recvShape_ = shape.recvElems;
    names_.clear();
    namesInPlace_.clear();
    for (int i = 0; i < opt_.iters; ++i) {  // made here, not in the timed loop
      names_.push_back(baseName() + "." + std::to_string(i));
      namesInPlace_.push_back(baseName() + ".inplace." + std::to_string(i));
    }

    Row row;
    row.shape = shape;
    if (cuda_) {  // the timed loops run on the device buffers: give them real values first
      fillInputs(false);
      uploadInputs();
    }
    if (coll_.horaOutOfPlace) row.outOfPlace = timeHora(false);
    if (coll_.horaInPlace) row.inPlace = timeHora(true);
    if (opt_.mpi && fitsMpi()) row.mpi = timeBaseline([this] { mpiOnce(); });
    if (gloo_) row.gloo = timeBaseline([this] { glooOnce(); });
    if (cuda_) row.nccl = timeNccl();
    if (opt_.memcpy) row.memcpy = timeBaseline([this] {
      std::memcpy(recv_.data(), send_.data(), static_cast<size_t>(shape_.bytes));
    });

    // Verification: after every timed loop, one op per column on freshly filled inputs.
    if (opt_.check) {
      if (row.outOfPlace.ran) row.outOfPlace.wrong = verifyHora(false);
      if (row.inPlace.ran) row.inPlace.wrong = verifyHora(true);
      if (row.mpi.ran) row.mpi.wrong = verifyBaseline([this] { mpiOnce(); });
      if (row.gloo.ran) row.gloo.wrong = verifyBaseline([this] { glooOnce(); });
      if (row.nccl.ran) row.nccl.wrong = verifyNccl();
      int64_t wrong[5] = {row.outOfPlace.wrong, row.inPlace.wrong, row.mpi.wrong, row.gloo.wrong,
                          row.nccl.wrong};
      MPI_Allreduce(MPI_IN_PLACE, wrong, 5, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      row.outOfPlace.wrong = wrong[0];
      row.inPlace.wrong = wrong[1];
      row.mpi.wrong = wrong[2];
      row.gloo.wrong = wrong[3];
      row.nccl.wrong = wrong[4];
    }

    const double factor = busFactor(coll_.coll, n_);
    for (Timing *t : {&row.outOfPlace, &row.inPlace, &row.mpi, &row.gloo, &row.memcpy, &row.nccl}) {
      if (!t->ran) continue;
      t->algbw = static_cast<double>(shape.bytes) / (t->timeUs * 1e3);  // GB/s
      t->busbw = t == &row.memcpy ? t->algbw : t->algbw * factor;
    }
    return row;
  }

 private:
  std::string baseName() const {
    return std::string("bench.") + coll_.name + "." + std::to_string(shape_.bytes);
  }

  // Raw MPI counts are ints.
  bool fitsMpi() const {
    return std::max(shape_.sendElems, shape_.recvElems) <= INT_MAX;
  }

  // ---- hora

  hora_request_t submit(bool inPlace, const char *name) {
    hora_request_t req = nullptr;
    hora_status_t st = HORA_SUCCESS;
    DLTensor in = cpuTensor(sendData(), type_.dl, &sendShape_);
    DLTensor out = cpuTensor(recvData(), type_.dl, &recvShape_);
    if (cuda_) in.device = out.device = DLDevice{kDLCUDA, cuda_->device()};
    switch (coll_.coll) {
      case Coll::kAllreduce:
        st = hora_allreduce_async(name, inPlace ? &out : &in, &out, op_.hora, 1.0, 1.0, 0, &req);
        break;
      case Coll::kAllgather: st = hora_allgather_async(name, &in, 0, &req); break;
      case Coll::kBroadcast: st = hora_broadcast_async(name, &out, opt_.root, 0, &req); break;
      case Coll::kReducescatter: st = hora_reducescatter_async(name, &in, op_.hora, 0, &req); break;
      case Coll::kAlltoall: st = hora_alltoall_async(name, &in, nullptr, 0, &req); break;
    }
    checkHora(st, "submitting a hora op");
    return req;
  }

  // k ops: submitted in batches of at most -n (the timed loop is one batch), each batch then
  // waited for (each request freed as soon as it is done, so that hora-allocated outputs go
  // early); op i is named names[i % n]: the warm-up uses the timed loop's names, and hora caches
  // what it negotiated by name. With --blocking 1 each op is waited for in turn, all under one
  // name, as a latency loop over one tensor would (n names would time the coordinator instead of
  // the response cache once 2n passed the cache's capacity).
  void runHora(bool inPlace, int k) {
    const std::vector<std::string> &names = inPlace ? namesInPlace_ : names_;
    if (opt_.blocking) {
      for (int i = 0; i < k; ++i) {
        hora_request_t r = submit(inPlace, names[0].c_str());
        checkHora(hora_wait(r), "hora_wait");
        hora_request_free(r);
      }
      return;
    }
    for (int done = 0; done < k;) {
      const int batch = std::min(opt_.iters, k - done);
      pending_.clear();
      for (int i = 0; i < batch; ++i) pending_.push_back(submit(inPlace, names[i].c_str()));
      for (hora_request_t r : pending_) {
        checkHora(hora_wait(r), "hora_wait");
        hora_request_free(r);
      }
      pending_.clear();
      done += batch;
    }
  }

  // The timing methodology of every column: warm-up first (untimed), then --trials times an
  // MPI_Barrier, `iters` ops and the slowest rank's elapsed time over iters; the figure is the
  // median trial. Verification never runs in here.
  template <typename F>
  Timing timeLoop(F &&body, int warmup) {
    body(warmup);
    Timing t;
    t.ran = true;
    for (int trial = 0; trial < opt_.trials; ++trial) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      body(opt_.iters);
      const double elapsed = MPI_Wtime() - t0;
      t.trialsUs.push_back(slowestRank(elapsed) * 1e6 / opt_.iters);
    }
    t.timeUs = median(t.trialsUs);
    return t;
  }

  Timing timeHora(bool inPlace) {
    // At least two batches: a name's first op goes through the coordinator, its second through
    // the response cache, the path of every later training step; one batch warms only the first.
    return timeLoop([&](int k) { runHora(inPlace, k); }, std::max(opt_.warmup, 2 * opt_.iters));
  }

  template <typename F>
  Timing timeBaseline(F &&once) {
    return timeLoop([&](int k) {
      for (int i = 0; i < k; ++i) once();
    }, opt_.warmup);
  }

  // ---- baselines

  void mpiOnce() {
    const int c = static_cast<int>(shape_.count);
    const MPI_Datatype t = mpiReduce_.type;
    switch (coll_.coll) {
      case Coll::kAllreduce:
        MPI_Allreduce(send_.data(), recv_.data(), c, t, mpiReduce_.op, MPI_COMM_WORLD);
        break;
      case Coll::kAllgather:
        MPI_Allgather(send_.data(), c, t, recv_.data(), c, t, MPI_COMM_WORLD);
        break;
      case Coll::kBroadcast: MPI_Bcast(recv_.data(), c, t, opt_.root, MPI_COMM_WORLD); break;
      case Coll::kReducescatter:
        MPI_Reduce_scatter_block(send_.data(), recv_.data(), c, t, mpiReduce_.op, MPI_COMM_WORLD);
        break;
      case Coll::kAlltoall:
        MPI_Alltoall(send_.data(), c, t, recv_.data(), c, t, MPI_COMM_WORLD);
        break;
    }
  }

  void glooOnce() {
    const int e = type_.bytes;
    switch (coll_.coll) {
      case Coll::kAllreduce:
        gloo_->allreduce(send_.data(), recv_.data(), shape_.count, e, glooReduce_);
        break;
      case Coll::kAllgather: gloo_->allgather(send_.data(), recv_.data(), shape_.count * e); break;
      case Coll::kBroadcast: gloo_->broadcast(recv_.data(), shape_.bytes, opt_.root); break;
      case Coll::kReducescatter: {
        // Reduce all of it into recv, then keep this rank's block at the start, where
        // MPI_Reduce_scatter_block and hora put it. recv holds shape.bytes (see capacity).
        gloo_->allreduce(send_.data(), recv_.data(), shape_.sendElems, e, glooReduce_);
        const size_t block = static_cast<size_t>(shape_.count * e);
        std::memmove(recv_.data(), recv_.data() + static_cast<size_t>(rank_) * block, block);
        break;
      }
      case Coll::kAlltoall: gloo_->alltoall(send_.data(), recv_.data(), shape_.bytes); break;
    }
  }

  // ---- verification

  // Fills what the op reads: send, or for broadcast (and in-place allreduce) the buffer itself.
  void fillInputs(bool inPlace) {
    const int64_t c = shape_.count;
    uint8_t *in = inPlace ? recv_.data() : send_.data();
    switch (coll_.coll) {
      case Coll::kAllreduce: case Coll::kReducescatter:
        for (int64_t k = 0; k < shape_.sendElems; ++k)
          storeValue(type_, in, k, reduceInput(op_.hora, rank_, n_, k));
        break;
      case Coll::kAllgather:
        for (int64_t j = 0; j < c; ++j) storeValue(type_, in, j, patternValue(rank_, 0, j));
        break;
      case Coll::kAlltoall:  // block p goes to rank p
        for (int64_t k = 0; k < shape_.sendElems; ++k)
          storeValue(type_, in, k, patternValue(rank_, k / c, k % c));
        break;
      case Coll::kBroadcast:  // what non-roots hold differs from the root's everywhere
        for (int64_t j = 0; j < c; ++j)
          storeValue(type_, recv_.data(), j,
                     rank_ == opt_.root ? patternValue(opt_.root, 0, j)
                                        : patternValue(opt_.root + 1, 1, j));
        break;
    }
    // Out of place: the output starts as garbage that no expected value equals.
    if (!inPlace && coll_.coll != Coll::kBroadcast)
      std::memset(recv_.data(), 0xA5, static_cast<size_t>(shape_.recvElems * type_.bytes));
  }

  // Element k of this rank's output, computed here without any communication. avgAsSum: the
  // MPI and Gloo columns sum where hora averages.
  double expected(int64_t k, bool avgAsSum) const {
    const int64_t c = shape_.count;
    const double scale = avgAsSum && op_.hora == HORA_OP_AVERAGE ? n_ : 1;
    switch (coll_.coll) {
      case Coll::kAllreduce: return reduceExpected(op_.hora, n_, k) * scale;
      case Coll::kReducescatter: return reduceExpected(op_.hora, n_, rank_ * c + k) * scale;
      case Coll::kAllgather: return patternValue(k / c, 0, k % c);
      case Coll::kAlltoall: return patternValue(k / c, rank_, k % c);
      case Coll::kBroadcast: return patternValue(opt_.root, 0, k);
    }
    return 0;
  }

  int64_t countWrong(const void *out, int64_t elems, bool avgAsSum) const {
    if (elems != shape_.recvElems) return shape_.recvElems;  // the wrong shape: all wrong
    int64_t wrong = 0;
    for (int64_t k = 0; k < elems; ++k) wrong += loadValue(type_, out, k) != expected(k, avgAsSum);
    return wrong;
  }

  int64_t verifyHora(bool inPlace) {
    fillInputs(inPlace);
    uploadInputs();
    const std::string name = baseName() + (inPlace ? ".inplace.check" : ".check");
    hora_request_t r = submit(inPlace, name.c_str());
    checkHora(hora_wait(r), "hora_wait");
    const void *out = recv_.data();
    int64_t elems = shape_.recvElems;
    std::vector<uint8_t> fromDevice;
    if (const DLTensor *t = hora_request_output(r)) {  // allocated by hora
      out = t->data;
      elems = 1;
      for (int d = 0; d < t->ndim; ++d) elems *= t->shape[d];
      if (t->dtype.code != type_.dl.code || t->dtype.bits != type_.dl.bits) elems = -1;
      if (cuda_ && elems > 0) {
        fromDevice.resize(static_cast<size_t>(elems * type_.bytes));
        cuda_->download(fromDevice.data(), t->data, fromDevice.size());
        out = fromDevice.data();
      }
    } else {
      downloadOutput();
    }
    const int64_t wrong = countWrong(out, elems, false);
    hora_request_free(r);
    return wrong;
  }

  // ---- --device cuda: the same buffers on the GPU, and the raw NCCL column

  void *sendData() const { return cuda_ ? cuda_->send() : send_.data(); }
  void *recvData() const { return cuda_ ? cuda_->recv() : recv_.data(); }

  // fillInputs writes the host buffers; the GPU gets both (recv holds in-place and broadcast
  // inputs, and out-of-place garbage).
  void uploadInputs() {
    if (!cuda_) return;
    cuda_->upload(cuda_->send(), send_.data(), static_cast<size_t>(shape_.sendElems * type_.bytes));
    cuda_->upload(cuda_->recv(), recv_.data(), static_cast<size_t>(shape_.recvElems * type_.bytes));
  }
  void downloadOutput() {
    if (cuda_) cuda_->download(recv_.data(), cuda_->recv(), static_cast<size_t>(shape_.recvElems * type_.bytes));
  }

  NcclColl ncclColl() const {
    switch (coll_.coll) {
      case Coll::kAllreduce: return NcclColl::kAllreduce;
      case Coll::kAllgather: return NcclColl::kAllgather;
      case Coll::kBroadcast: return NcclColl::kBroadcast;
      case Coll::kReducescatter: return NcclColl::kReducescatter;
      case Coll::kAlltoall: return NcclColl::kAlltoall;
    }
    return NcclColl::kAllreduce;
  }
  void ncclOnce() { cuda_->ncclOnce(ncclColl(), type_.name, op_.name, shape_.count, opt_.root); }

  // Like nccl-tests: -n collectives queued back to back on the stream, one synchronisation.
  Timing timeNccl() {
    return timeLoop([&](int k) {
      for (int i = 0; i < k; ++i) ncclOnce();
      cuda_->synchronize();
    }, opt_.warmup);
  }
  int64_t verifyNccl() {
    fillInputs(false);
    uploadInputs();
    ncclOnce();
    cuda_->synchronize();
    downloadOutput();
    return countWrong(recv_.data(), shape_.recvElems, false);  // ncclAvg averages itself
  }

  template <typename F>
  int64_t verifyBaseline(F &&once) {
    fillInputs(false);
    once();
    return countWrong(recv_.data(), shape_.recvElems, true);
  }

  const Options &opt_;
  const CollInfo &coll_;
  const DType &type_;
  const ReduceOp &op_;
  const int rank_, n_;
  Gloo *gloo_;
  CudaSide *cuda_;  // --device cuda, else nullptr
  MpiReduce mpiReduce_;
  ReduceFn glooReduce_ = nullptr;
  Buffer send_, recv_;
  Shape shape_;
  int64_t sendShape_ = 0, recvShape_ = 0;
  std::vector<std::string> names_, namesInPlace_;
  std::vector<hora_request_t> pending_;
};

// ---- output ------------------------------------------------------------------------------------

// Three significant digits: small sizes give ratios far below 0.01.
std::string ratio(double hora, double other) {
  const double r = hora / other;
  if (!std::isfinite(r)) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, r >= 100 ? "%.0f" : "%.3g", r);
  return b;
}

void writeJson(FILE *f, const Options &o, const CollInfo &c, const DType &t, const ReduceOp &op,
               int n, const std::string &glooSkipped, bool glooRan,
               const std::vector<Row> &rows, int64_t totalWrong, double avgBusbw) {
  JsonWriter j(f);
  j.beginObject();
  j.field("collective", c.name).field("ranks", n).field("dtype", t.name);
  j.field("redop", c.reduces ? op.name : "none").field("root", c.coll == Coll::kBroadcast ? o.root : -1);
  j.field("iters", o.iters).field("warmup", o.warmup).field("trials", o.trials);
  j.field("blocking", o.blocking);
  j.field("device", o.device);
  j.field("check", o.check).field("mpi_call", o.mpi ? c.mpiCall : "");
  j.field("gloo", glooRan);
  if (glooSkipped.empty()) j.key("gloo_skipped").null(); else j.field("gloo_skipped", glooSkipped);
  j.field("wrong", totalWrong).field("avg_busbw_gbs", avgBusbw);
  j.key("rows").beginArray();
  auto group = [&](const char *name, const Timing &g, bool hasWrong, bool memcpy) {
    j.key(name);
    if (!g.ran) {
      j.null();
      return;
    }
    j.beginObject().field("time_us", g.timeUs);
    j.key("trials_us").beginArray();
    for (double us : g.trialsUs) j.value(us);
    j.endArray();
    if (memcpy) {
      j.field("gbs", g.algbw);
    } else {
      j.field("algbw_gbs", g.algbw).field("busbw_gbs", g.busbw);
    }
    if (hasWrong) {
      if (o.check) j.field("wrong", g.wrong); else j.key("wrong").null();
    }
    j.endObject();
  };
  for (const Row &r : rows) {
    j.beginObject();
    j.field("size", r.shape.bytes).field("count", r.shape.count).field("type", t.name);
    j.field("redop", c.reduces ? op.name : "none").field("root", c.coll == Coll::kBroadcast ? o.root : -1);
    group("hora_out_of_place", r.outOfPlace, true, false);
    group("hora_in_place", r.inPlace, true, false);
    group("mpi", r.mpi, true, false);
    group("gloo", r.gloo, true, false);
    group("memcpy", r.memcpy, false, true);
    group("nccl", r.nccl, true, false);
    const double h = r.hora().algbw;
    j.field("hora_over_mpi", h / r.mpi.algbw).field("hora_over_gloo", h / r.gloo.algbw);
    j.field("hora_over_memcpy", h / r.memcpy.algbw).field("hora_over_nccl", h / r.nccl.algbw);
    j.endObject();
  }
  j.endArray();
  j.endObject();
}

// gnuplot single-quoted string: a quote is doubled.
std::string gnuplotQuote(const std::string &s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

// busbw against size on a log2 axis, one line per column, drawn by gnuplot into `png`.
std::string plot(const std::string &png, const std::string &title, const std::vector<Row> &rows) {
  const char *tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/hora-bench-plot-XXXXXX";
  if (!mkdtemp(dir.data())) return "mkdtemp: " + std::string(std::strerror(errno));
  const std::string data = dir + "/rows.dat", script = dir + "/plot.gp";
  struct Series {
    const char *title;
    Timing Row::*column;
  };
  const Series series[] = {
      {"hora out-of-place", &Row::outOfPlace}, {"hora in-place", &Row::inPlace},
      {"raw MPI", &Row::mpi},                  {"Gloo", &Row::gloo},
      {"memcpy bound (GB/s per rank)", &Row::memcpy}, {"raw NCCL", &Row::nccl},
  };
  FILE *d = std::fopen(data.c_str(), "w");
  if (!d) return "cannot write " + data + ": " + std::strerror(errno);
  for (const Row &r : rows) {
    std::fprintf(d, "%lld", static_cast<long long>(r.shape.bytes));
    for (const Series &s : series) {
      const Timing &t = r.*s.column;
      if (t.ran) std::fprintf(d, " %.6g", t.busbw); else std::fprintf(d, " NaN");
    }
    std::fprintf(d, "\n");
  }
  std::fclose(d);
  FILE *g = std::fopen(script.c_str(), "w");
  if (!g) return "cannot write " + script + ": " + std::strerror(errno);
  std::fprintf(g,
               "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 1100,650 noenhanced\n"
               "} else {\n"
               "  set terminal png size 1100,650 noenhanced\n"
               "}\n"
               "set output %s\n"
               "set title %s\n"
               "set datafile missing 'NaN'\n"
               "set logscale x 2\n"
               "set format x '%%.0b%%BB'\n"
               "set format y '%%g'\n"
               "set xlabel 'size'\n"
               "set logscale y 10\n"  // small and large sizes differ by orders of magnitude
               "set ylabel 'busbw (GB/s), log scale'\n"
               "set grid\n"
               "set key outside below\n",
               gnuplotQuote(png).c_str(), gnuplotQuote(title).c_str());
  std::string plots;
  for (size_t i = 0; i < sizeof series / sizeof series[0]; ++i) {
    const bool any = std::any_of(rows.begin(), rows.end(),
                                 [&](const Row &r) { return (r.*series[i].column).ran; });
    if (!any) continue;
    plots += (plots.empty() ? "plot " : ", \\\n     ") + gnuplotQuote(data) + " using 1:" +
             std::to_string(i + 2) + " with linespoints lw 2 title " +
             gnuplotQuote(series[i].title);
  }
  std::fprintf(g, "%s\n", plots.c_str());
  std::fclose(g);
  const std::string cmd = "gnuplot " + gnuplotQuote(script) + " 2>&1";
  FILE *p = popen(cmd.c_str(), "r");
  std::string output;
  if (p) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) output += buf;
  }
  const int status = p ? pclose(p) : -1;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (status != 0)
    return "gnuplot failed (status " + std::to_string(status) + "): " + output;
  return "";
}

int run(int argc, char **argv, int rank, int n) {
  Options opt;
  std::string error;
  const ParseResult parsed = parseCommandLine(argc, argv, optionSpecs(&opt), &error);
  if (parsed == ParseResult::kHelp) {
    if (rank == 0) usage(stdout);
    return 0;
  }
  const DType *type = findDType(opt.dtype);
  const ReduceOp *op = findReduceOp(opt.redop);
  const CollInfo *coll = findColl(opt.coll);
  if (parsed == ParseResult::kRun) {
    if (!coll)
      error = "unknown --op " + opt.coll +
              " (allreduce, allgather, broadcast, reducescatter or alltoall)";
    else if (!type)
      error = "unknown -d " + opt.dtype + " (" + dtypeNames() + ")";
    else if (!op)
      error = "unknown -o " + opt.redop + " (" + reduceOpNames() + ")";
    else if (coll->reduces && op->hora == HORA_OP_AVERAGE && !type->isFloat)
      error = "-o avg needs a floating-point -d (hora averages floats only)";
    else if (opt.minBytes < 1 || opt.maxBytes < opt.minBytes)
      error = "need 1 <= -b <= -e";
    else if (opt.root >= n)
      error = "-r " + std::to_string(opt.root) + " is not a rank (" + std::to_string(n) +
              " ranks)";
    else if (opt.device != "cpu" && opt.device != "cuda")
      error = "unknown --device " + opt.device + " (cpu or cuda)";
    else if (opt.device == "cuda" && !HORA_BENCH_CUDA)
      error = "--device cuda: this build has no NCCL backend (meson found no CUDA/NCCL/nvcc)";
    else if (opt.device == "cuda" && CudaSide::deviceCount() == 0)
      error = "--device cuda: no CUDA device is visible to this process";
  }
  // Files and tools that rank 0 needs at the end, checked before a long run.
  if (error.empty() && parsed == ParseResult::kRun && rank == 0) {
    if (!opt.json.empty()) error = unwritable(opt.json);
    if (error.empty() && !opt.plot.empty()) {
      error = unwritable(opt.plot);
      if (error.empty() && !inPath("gnuplot"))
        error = "--plot needs gnuplot, which is not in PATH (Debian: apt-get install gnuplot-nox)";
    }
  }
  if (usageErrorAnywhere(error, rank)) return 1;

  // On the GPU the CPU columns do not apply: the raw NCCL column takes their place.
  const bool cudaMode = opt.device == "cuda";
  if (cudaMode) opt.mpi = opt.gloo = opt.memcpy = false;

  checkHora(hora_init(), "hora_init");
  if (hora_size() != n) failHere("hora sees " + std::to_string(hora_size()) + " ranks, MPI " +
                                 std::to_string(n));
  const std::vector<RankInfo> ranks = gatherRanks();

  std::unique_ptr<Gloo> gloo;
  std::string glooSkipped;
#if HORA_BENCH_GLOO
  if (opt.gloo) gloo = Gloo::connect(rank, ranks, &glooSkipped);
#else
  glooSkipped = "this build has no Gloo (meson found no libgloo-dev)";
#endif
  if (!opt.gloo) glooSkipped = cudaMode ? "--device cuda" : "--gloo 0";

  // Sizes from -b to -e, times -f; rows whose rounded size repeats are dropped.
  std::vector<Shape> shapes;
  size_t capacity = 0;
  for (double b = static_cast<double>(opt.minBytes); b <= static_cast<double>(opt.maxBytes) * (1 + 1e-12);
       b *= opt.factor) {
    const Shape s = shapeFor(*coll, static_cast<int64_t>(b), type->bytes, n);
    if (!shapes.empty() && shapes.back().bytes == s.bytes) continue;
    shapes.push_back(s);
    // Both buffers hold a whole size: the memcpy bound copies it, and Gloo's reducescatter
    // column reduces the full input into recv.
    capacity = std::max(capacity, static_cast<size_t>(s.bytes));
  }

  std::unique_ptr<CudaSide> cuda;
  if (cudaMode) {
    try {
      cuda = std::make_unique<CudaSide>(hora_local_rank(), capacity);
    } catch (const std::exception &e) {
      failHere(std::string("--device cuda: ") + e.what());
    }
  }

  const bool bcast = coll->coll == Coll::kBroadcast;
  const char *redop = coll->reduces ? op->name : "none";
  if (rank == 0) {
    std::printf("# hora-bench: %s, %d ranks, %s, redop %s%s, %s .. %s x%g, %d iters, %d warm-up, "
                "%d trial%s, check %s\n",
                coll->name, n, type->name, redop,
                bcast ? (", root " + std::to_string(opt.root)).c_str() : "",
                humanBytes(opt.minBytes).c_str(), humanBytes(opt.maxBytes).c_str(), opt.factor,
                opt.iters, opt.warmup, opt.trials, opt.trials == 1 ? "" : "s",
                opt.check ? "on" : "off");
    std::printf("# hora: %s; time = mean per op, slowest rank%s\n",
                opt.blocking ? "blocking, each op waited for before the next (--blocking 1)"
                             : "-n ops submitted async back to back, then one wait for all",
                opt.trials == 1 ? "" : ", median of the trials");
    // A timed loop names -n ops: past the response cache's capacity every op negotiates through
    // the coordinator, which a training step (whose names repeat) does not.
    const char *capacityText = std::getenv("HORA_CACHE_CAPACITY");
    const long capacity = capacityText != nullptr ? std::atol(capacityText) : kDefaultCacheCapacity;
    if (!opt.blocking && opt.iters > capacity)
      std::printf("# note: -n %d names more ops than the response cache holds "
                  "(HORA_CACHE_CAPACITY=%ld): hora's columns time its coordinator, not the cached "
                  "path; raise HORA_CACHE_CAPACITY to time that\n",
                  opt.iters, capacity);
    if (opt.mpi)
      std::printf("# raw MPI: %s, blocking calls on the same buffers%s\n", coll->mpiCall,
                  !coll->reduces ? ""
                  : op->hora == HORA_OP_AVERAGE ? " (avg timed as a sum)"
                  : type->mpi == MPI_DATATYPE_NULL ? " (a user op on 16-bit words)" : "");
    if (gloo)
      std::printf("# Gloo: %s, blocking calls, tcp over 127.0.0.1%s\n", coll->glooCall,
                  coll->reduces && op->hora == HORA_OP_AVERAGE ? " (avg timed as a sum)" : "");
    else
      std::printf("# Gloo column skipped: %s\n", glooSkipped.c_str());
    if (opt.memcpy)
      std::printf("# memcpy: every rank copies size bytes at once; GB/s = size / time\n");
    if (cuda)
      std::printf("# --device cuda: every tensor on the rank's GPU (local rank %% GPUs); raw NCCL: "
                  "-n ops on one stream, one synchronisation, on the same buffers\n");
    std::printf("# busbw = algbw x %s; ratios: hora's algbw (%s) over the column's\n",
                coll->coll == Coll::kAllreduce ? "2(n-1)/n" : bcast ? "1" : "(n-1)/n",
                bcast ? "in place" : "out of place");
    printRanks(stdout, ranks);
    std::printf("#\n");
  }

  Table table;
  table.addGroup("", {{"size", "(B)", 12}, {"count", "(elements)", 12}, {"type", "", 8},
                      {"redop", "", 6}, {"root", "", 6}});
  table.addGroup("out-of-place", {{"time", "(us)", 7}, {"algbw", "(GB/s)", 6},
                                  {"busbw", "(GB/s)", 6}, {"#wrong", "", 5}});
  table.addGroup("in-place", {{"time", "(us)", 7}, {"algbw", "(GB/s)", 6},
                              {"busbw", "(GB/s)", 6}, {"#wrong", "", 5}});
  if (opt.mpi) table.addGroup("raw MPI", {{"time", "(us)", 7}, {"busbw", "(GB/s)", 6}});
  if (gloo) table.addGroup("Gloo", {{"time", "(us)", 7}, {"busbw", "(GB/s)", 6}});
  if (opt.memcpy) table.addGroup("memcpy", {{"time", "(us)", 7}, {"GB/s", "", 6}});
  if (cuda) table.addGroup("raw NCCL", {{"time", "(us)", 7}, {"busbw", "(GB/s)", 6}});
  std::vector<Table::Column> ratioColumns;
  if (opt.mpi) ratioColumns.push_back({"hora/MPI", "", 8});
  if (gloo) ratioColumns.push_back({"hora/Gloo", "", 9});
  if (opt.memcpy) ratioColumns.push_back({"hora/memcpy", "", 11});
  if (cuda) ratioColumns.push_back({"hora/NCCL", "", 9});
  if (!ratioColumns.empty()) table.addGroup("ratios", ratioColumns);
  if (rank == 0) {
    table.printHeader(stdout);
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  {
    Bench bench(opt, *coll, *type, *op, rank, n, capacity, gloo.get(), cuda.get());
    // A process's first ops are cold (code, allocator, the engine's first cycles); nccl-tests too
    // warms up at the smallest size first. Bandwidth-bound sizes need no such pass.
    if (!shapes.empty() && shapes.front().bytes <= kColdPassMaxBytes) bench.run(shapes.front());
    for (const Shape &s : shapes) {
      rows.push_back(bench.run(s));
      const Row &r = rows.back();
      if (rank != 0) continue;
      auto wrong = [&](const Timing &t) {
        return !t.ran ? std::string("n/a") : opt.check ? std::to_string(t.wrong) : "N/A";
      };
      std::vector<std::string> cells = {
          std::to_string(r.shape.bytes), std::to_string(r.shape.count), type->name, redop,
          std::to_string(bcast ? opt.root : -1)};
      for (const Timing *t : {&r.outOfPlace, &r.inPlace}) {
        cells.push_back(formatTime(t->timeUs));
        cells.push_back(formatFixed(t->algbw, 2));
        cells.push_back(formatFixed(t->busbw, 2));
        cells.push_back(wrong(*t));
      }
      for (const Timing *t : {&r.mpi, &r.gloo, &r.memcpy, &r.nccl}) {
        if ((t == &r.mpi && !opt.mpi) || (t == &r.gloo && !gloo) ||
            (t == &r.memcpy && !opt.memcpy) || (t == &r.nccl && !cuda))
          continue;
        cells.push_back(formatTime(t->timeUs));
        cells.push_back(formatFixed(t->busbw, 2));
      }
      const double h = r.hora().algbw;
      if (opt.mpi) cells.push_back(ratio(h, r.mpi.algbw));
      if (gloo) cells.push_back(ratio(h, r.gloo.algbw));
      if (opt.memcpy) cells.push_back(ratio(h, r.memcpy.algbw));
      if (cuda) cells.push_back(ratio(h, r.nccl.algbw));
      table.printRow(stdout, cells);
      std::fflush(stdout);
    }
  }

  // nccl-tests' footer: the average over every hora bus bandwidth printed (both forms).
  int64_t horaWrong = 0, baselineWrong = 0;
  double busSum = 0, mpiSum = 0, glooSum = 0, ncclSum = 0;
  int busCount = 0, mpiCount = 0, glooCount = 0, ncclCount = 0;
  for (const Row &r : rows) {
    for (const Timing *t : {&r.outOfPlace, &r.inPlace}) {
      if (!t->ran) continue;
      horaWrong += t->wrong;
      busSum += t->busbw;
      ++busCount;
    }
    baselineWrong += r.mpi.wrong + r.gloo.wrong + r.nccl.wrong;
    if (r.nccl.ran) ncclSum += r.nccl.busbw, ++ncclCount;
    if (r.mpi.ran) mpiSum += r.mpi.busbw, ++mpiCount;
    if (r.gloo.ran) glooSum += r.gloo.busbw, ++glooCount;
  }
  const double avgBus = busCount ? busSum / busCount : std::nan("");
  int status = horaWrong || baselineWrong ? 1 : 0;
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(horaWrong),
                !opt.check ? "(not checked)" : horaWrong ? "FAILED" : "OK");
    if (baselineWrong)
      std::printf("# MPI, Gloo or NCCL results wrong: %lld (a bug in the benchmark or the library)\n",
                  static_cast<long long>(baselineWrong));
    std::printf("# Avg bus bandwidth    : %g\n", avgBus);
    if (mpiCount) std::printf("# Avg MPI bus bandwidth: %g\n", mpiSum / mpiCount);
    if (glooCount) std::printf("# Avg Gloo bus bandwidth: %g\n", glooSum / glooCount);
    if (ncclCount) std::printf("# Avg NCCL bus bandwidth: %g\n", ncclSum / ncclCount);
    std::printf("#\n");
    std::fflush(stdout);
    if (!opt.json.empty()) {
      FILE *f = std::fopen(opt.json.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "%s: cannot write %s: %s\n", programName(), opt.json.c_str(),
                     std::strerror(errno));
        status = 2;
      } else {
        writeJson(f, opt, *coll, *type, *op, n, glooSkipped, gloo != nullptr, rows,
                  horaWrong + baselineWrong, avgBus);
        std::fclose(f);
      }
    }
    if (!opt.plot.empty()) {
      const std::string title = std::string("hora-bench ") + coll->name + ", " +
                                std::to_string(n) + " ranks, " + type->name +
                                (coll->reduces ? std::string(" ") + op->name : std::string());
      const std::string why = plot(opt.plot, title, rows);
      if (!why.empty()) {
        std::fprintf(stderr, "%s: --plot %s: %s\n", programName(), opt.plot.c_str(), why.c_str());
        status = 2;
      } else {
        std::printf("# plot: %s\n", opt.plot.c_str());
      }
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  gloo.reset();
  checkHora(hora_shutdown(), "hora_shutdown");
  return status;
}

}  // namespace
}  // namespace hora::bench

int main(int argc, char **argv) {
  return hora::bench::runUnderMpi(argc, argv, "hora-bench", hora::bench::run);
}
