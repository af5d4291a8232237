// SPDX-License-Identifier: Apache-2.0
// hora-bench: collective bandwidth in the nccl-tests layout, hora against raw MPI, Gloo and memcpy.

#include "bench_util.h"
#include "bench_cuda.h"
#include "raw_gloo.h"
#include "world.h"

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
#include <functional>
#include <memory>
#include <string>
#include <vector>


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

// hora's names, and nccl-tests' (all_reduce, all_gather, reduce_scatter, alltoall, broadcast, with
// or without its binaries' "_perf").
const CollInfo *findColl(std::string name) {
  if (name.size() > 5 && name.compare(name.size() - 5, 5, "_perf") == 0) name.resize(name.size() - 5);
  name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
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
  std::string planes;  // --planes, "" = defaultPlanes()
  std::string device = "cpu";  // cpu, or cuda (--device cuda: tensors on the GPU, raw NCCL column)
  std::string json, plot;
  std::vector<std::string> notes;  // nccl-tests options that do not apply here, said in the header
};

void usage(FILE *f) {
  std::fprintf(
      f,
      "usage: mpirun -np N hora-bench [COLLECTIVE] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]\n"
      "         [-w WARMUP] [--trials T] [-c 0|N] [-o %s] [-d %s]\n"
      "         [-r ROOT] [-z 0|1] [--planes LIST] [--mpi 0|1] [--gloo 0|1] [--memcpy 0|1]\n"
      "         [--json FILE] [--plot FILE.png]\n"
      "  COLLECTIVE: allreduce (default), allgather, broadcast, reducescatter, alltoall, or\n"
      "  nccl-tests' names (all_reduce, all_gather, reduce_scatter, all_reduce_perf, ...);\n"
      "  --coll NAME says the same\n"
      "   or: tools/horarun -np N hora-bench ...   (or torchrun-style variables: MASTER_ADDR,\n"
      "       MASTER_PORT, RANK, WORLD_SIZE; or srun)\n"
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
      "  -c, --check      0: no check; N: verify results, counted in #wrong (default 1; each\n"
      "                   size is checked once whatever N); never timed\n"
      "  -o, --op         reduction of allreduce and reducescatter (default sum; --redop too; a\n"
      "                   collective's name here still picks the collective)\n"
      "  -d, --datatype   element type (default float)\n"
      "  -r, --root       broadcast root (default 0)\n"
      "  -z, --blocking 1 latency mode: wait for each hora op before submitting the next\n"
      "  -a, -G, -t, -g   nccl-tests' averaging, CUDA graph, thread and GPU counts: taken and\n"
      "                   noted in the header, not applied (times are the slowest rank's; one GPU\n"
      "                   and one thread per rank)\n"
      "  --planes LIST    hora's CPU planes to compare, comma-separated: mpi, gloo, ucx (or auto,\n"
      "                   hora's own choice). The size sweep runs once per plane (hora_shutdown,\n"
      "                   HORA_CPU_BACKEND=PLANE, hora_init), all in one table. Default: mpi\n"
      "                   (under an MPI launcher only), gloo (where built), ucx; only the launched\n"
      "                   one where HORA_CPU_BACKEND is set. A plane that cannot start is reported\n"
      "                   as skipped, with hora's reason. Within one host hora may move a plane's\n"
      "                   allreduce through shared memory all the same (HORA_SHM=off stops that).\n"
      "                   PLANE:hier / PLANE:flat run it with HORA_HIERARCHICAL=on / off,\n"
      "                   PLANE:horovod hierarchically with one rank per host across (Horovod's way)\n"
      "  --mpi/--gloo/--memcpy 0   drop that column (all on by default; raw MPI only under an MPI\n"
      "                   launcher, Gloo only where built and every rank sees one /tmp)\n"
      "  --device cuda    tensors on the GPU (local rank modulo the GPUs seen), hora on NCCL, and\n"
      "                   a raw NCCL column on the same buffers instead of MPI, Gloo and memcpy\n"
      "                   (builds with NCCL only): -n ops on one stream, one synchronisation;\n"
      "                   with --blocking 1 each op synchronised before the next (a median op)\n"
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
      "Every time is the slowest rank's: a barrier, the loop, then the MAX over ranks (through MPI\n"
      "under an MPI launcher, else through hora); with --trials T, that T times over (one\n"
      "warm-up) and the median. time is a mean: the loop's time / -n. Where each op is waited\n"
      "for on its own (raw MPI and Gloo; hora with --blocking 1) a median column gives the\n"
      "median op, each op's time being the slowest rank's: a stall that the median hides shows\n"
      "in the mean.\n"
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
  auto collective = [o](const char *v) -> std::string {
    if (!findColl(v)) return "not a collective (allreduce, allgather, broadcast, reducescatter, alltoall)";
    o->coll = v;
    return "";
  };
  // nccl-tests options that have no meaning here: taken, and said in the table's header.
  auto notApplied = [o](const char *flag, const char *why) {
    return [o, flag, why](const char *v) -> std::string {
      int64_t n = 0;
      if (!parseInt(v, 0, INT_MAX, &n)) return "expected an integer";
      o->notes.push_back(std::string(flag) + " " + v + ": " + why);
      return "";
    };
  };
  return {
      {{""}, collective},
      {{"--coll", "--collective"}, collective},
      {{"-b", "--minbytes"}, bytes(&o->minBytes)},
      {{"-e", "--maxbytes"}, bytes(&o->maxBytes)},
      {{"-f", "--stepfactor"},
       [o](const char *v) -> std::string {
         return parseDouble(v, 1.0 + 1e-9, 1e9, &o->factor) ? "" : "expected a number > 1";
       }},
      {{"-n", "--iters"}, integer(&o->iters, 1)},
      {{"-w", "--warmup_iters"}, integer(&o->warmup, 0)},
      {{"--trials"}, integer(&o->trials, 1)},
      // nccl-tests: 0 = no check, N = check N iterations; hora-bench checks each size once.
      {{"-c", "--check"},
       [o](const char *v) -> std::string {
         int64_t n = 0;
         if (!parseInt(v, 0, INT_MAX, &n)) return "expected 0 (no check) or a count";
         o->check = n != 0;
         return "";
       }},
      // nccl-tests' --op is the reduction; a collective's name there is hora-bench's old spelling.
      {{"-o", "--op", "--redop"},
       [o](const char *v) -> std::string {
         if (findReduceOp(v)) {
           o->redop = v;
         } else if (findColl(v)) {
           o->coll = v;
         } else {
           return "expected a reduction (" + reduceOpNames() + ")";
         }
         return "";
       }},
      {{"-d", "--datatype"}, text(&o->dtype)},
      {{"-r", "--root"}, integer(&o->root, 0)},
      {{"-z", "--blocking"}, flag(&o->blocking)},
      {{"-a", "--average"},
       notApplied("-a", "n/a: every time is the slowest rank's (nccl-tests' -a 3)")},
      {{"-G", "--cudagraph"}, notApplied("-G", "n/a: hora launches no CUDA graphs")},
      {{"-t", "--nthreads"},
       notApplied("-t", "n/a: one rank per process; start more ranks instead of threads")},
      {{"-g", "--ngpus"},
       notApplied("-g", "n/a: one GPU per rank (the local rank's); start one rank per GPU")},
      {{"--mpi"}, flag(&o->mpi)},
      {{"--gloo"}, flag(&o->gloo)},
      {{"--memcpy"}, flag(&o->memcpy)},
      {{"--planes"}, text(&o->planes)},
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

// ---- the benchmark -----------------------------------------------------------------------------

struct Timing {
  bool ran = false;
  double timeUs = std::nan(""), algbw = std::nan(""), busbw = std::nan("");
  std::vector<double> trialsUs;  // each timed loop's mean per op; timeUs is their median
  // Ops waited for one at a time (raw MPI and Gloo; hora with --blocking 1): each op's time,
  // the slowest rank's, over every trial; medianUs is their median. Empty, NaN otherwise.
  std::vector<double> opsUs;
  double medianUs = std::nan("");
  int64_t wrong = 0;  // summed over ranks; only when checked
};

// hora on one plane: the forms this collective has.
struct PlaneTiming {
  Timing outOfPlace, inPlace;
  bool ran() const { return outOfPlace.ran || inPlace.ran; }
  // The form the ratios compare: out of place, else (broadcast) in place.
  const Timing &hora() const { return outOfPlace.ran ? outOfPlace : inPlace; }
};

struct Row {
  Shape shape;
  std::vector<PlaneTiming> planes;  // one per --planes entry (empty where it was skipped)
  Timing mpi, gloo, memcpy;  // memcpy: algbw is its GB/s
  Timing nccl;               // --device cuda: raw NCCL
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
// column: -w warm-up ops first, a barrier, the timed ops, then the slowest rank's elapsed time
// (a MAX over ranks) divided by -n; where ops are waited for one at a time, each op's time too
// (its slowest rank's), for the median. Verification runs afterwards, never inside a timed loop.
class Bench {
 public:
  Bench(const Options &o, const CollInfo &c, const DType &t, const ReduceOp &op, int rank, int n,
        size_t capacity, RawGloo *gloo)
      : opt_(o), coll_(c), type_(t), op_(op), rank_(rank), n_(n), gloo_(gloo),
        send_(capacity), recv_(capacity) {
    if (o.mpi) mpiReduce_ = makeMpiReduce(t, op);
    if (t.mpi == MPI_DATATYPE_NULL) mpiReduce_.type = MPI_UINT16_T;  // data movement: 16-bit words
    glooReduce_ = reduceFunction(t.kind, op.hora);
  }
  ~Bench() { freeMpiReduce(&mpiReduce_); }

  // --device cuda: the device buffers (made once hora runs: the GPU is the local rank's).
  void setCuda(CudaSide *cuda) { cuda_ = cuda; }

  // One size: hora on the plane that runs now (when `hora`), the raw columns (when `raw`), then
  // every result verified. The hora results land in *plane.
  void run(const Shape &shape, bool hora, bool raw, PlaneTiming *plane, Row *row) {
    shape_ = shape;
    sendShape_ = shape.sendElems;
    recvShape_ = shape.recvElems;
    names_.clear();
    namesInPlace_.clear();
    for (int i = 0; i < opt_.iters; ++i) {  // made here, not in the timed loop
      names_.push_back(baseName() + "." + std::to_string(i));
      namesInPlace_.push_back(baseName() + ".inplace." + std::to_string(i));
    }

    PlaneTiming h;
    Row r;
    if (cuda_) {  // the timed loops run on the device buffers: give them real values first
      fillInputs(false);
      uploadInputs();
    }
    if (hora && coll_.horaOutOfPlace) h.outOfPlace = timeHora(false);
    if (hora && coll_.horaInPlace) h.inPlace = timeHora(true);
    if (raw) {
      if (opt_.mpi && fitsMpi()) r.mpi = timeBaseline([this] { mpiOnce(); });
      if (gloo_) r.gloo = timeBaseline([this] { glooOnce(); });
      if (cuda_) r.nccl = timeNccl();
      if (opt_.memcpy) r.memcpy = timeBaseline([this] {
        std::memcpy(recv_.data(), send_.data(), static_cast<size_t>(shape_.bytes));
      }, false);
    }

    // Verification: after every timed loop, one op per column on freshly filled inputs.
    if (opt_.check) {
      if (h.outOfPlace.ran) h.outOfPlace.wrong = verifyHora(false);
      if (h.inPlace.ran) h.inPlace.wrong = verifyHora(true);
      if (r.mpi.ran) r.mpi.wrong = verifyBaseline([this] { mpiOnce(); });
      if (r.gloo.ran) r.gloo.wrong = verifyBaseline([this] { glooOnce(); });
      if (r.nccl.ran) r.nccl.wrong = verifyNccl();
      int64_t wrong[5] = {h.outOfPlace.wrong, h.inPlace.wrong, r.mpi.wrong, r.gloo.wrong,
                          r.nccl.wrong};
      sumOverRanks(wrong, 5);
      h.outOfPlace.wrong = wrong[0];
      h.inPlace.wrong = wrong[1];
      r.mpi.wrong = wrong[2];
      r.gloo.wrong = wrong[3];
      r.nccl.wrong = wrong[4];
    }

    const double factor = busFactor(coll_.coll, n_);
    for (Timing *t : {&h.outOfPlace, &h.inPlace, &r.mpi, &r.gloo, &r.memcpy, &r.nccl}) {
      if (!t->ran) continue;
      t->algbw = static_cast<double>(shape.bytes) / (t->timeUs * 1e3);  // GB/s
      t->busbw = t == &r.memcpy ? t->algbw : t->algbw * factor;
    }
    if (hora) *plane = h;
    if (raw) {
      row->mpi = r.mpi;
      row->gloo = r.gloo;
      row->memcpy = r.memcpy;
      row->nccl = r.nccl;
    }
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
  void runHora(bool inPlace, int k, std::vector<double> *stamps) {
    const std::vector<std::string> &names = inPlace ? namesInPlace_ : names_;
    if (opt_.blocking) {
      for (int i = 0; i < k; ++i) {
        hora_request_t r = submit(inPlace, names[0].c_str());
        checkHora(hora_wait(r), "hora_wait");
        if (stamps) stamps->push_back(now());
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

  // The timing methodology of every column: warm-up first (untimed), then --trials times a
  // barrier, `iters` ops and the slowest rank's elapsed time over iters; the figure is the
  // median trial. body(k, stamps) runs k ops; where stamps is given it appends the clock after
  // each op (ops waited for one at a time), and each op's time, slowest rank, goes to opsUs.
  // Verification never runs in here.
  template <typename F>
  Timing timeLoop(F &&body, int warmup, bool perOp) {
    body(warmup, nullptr);
    Timing t;
    t.ran = true;
    std::vector<double> stamps, opUs;
    stamps.reserve(static_cast<size_t>(opt_.iters));
    for (int trial = 0; trial < opt_.trials; ++trial) {
      barrier();
      stamps.clear();
      const double t0 = now();
      body(opt_.iters, perOp ? &stamps : nullptr);
      const double elapsed = now() - t0;
      t.trialsUs.push_back(slowestRank(elapsed) * 1e6 / opt_.iters);
      if (perOp && stamps.size() == static_cast<size_t>(opt_.iters)) {
        opUs.resize(stamps.size());
        for (size_t i = 0; i < stamps.size(); ++i)
          opUs[i] = (stamps[i] - (i ? stamps[i - 1] : t0)) * 1e6;
        maxOverRanks(opUs.data(), opUs.size());
        t.opsUs.insert(t.opsUs.end(), opUs.begin(), opUs.end());
      }
    }
    t.timeUs = median(t.trialsUs);
    if (!t.opsUs.empty()) t.medianUs = median(t.opsUs);
    return t;
  }

  Timing timeHora(bool inPlace) {
    // At least two batches: a name's first op goes through the coordinator, its second through
    // the response cache, the path of every later training step; one batch warms only the first.
    return timeLoop([&](int k, std::vector<double> *stamps) { runHora(inPlace, k, stamps); },
                    std::max(opt_.warmup, 2 * opt_.iters), opt_.blocking);
  }

  template <typename F>
  Timing timeBaseline(F &&once, bool perOp = true) {
    return timeLoop([&](int k, std::vector<double> *stamps) {
      for (int i = 0; i < k; ++i) {
        once();
        if (stamps) stamps->push_back(now());
      }
    }, opt_.warmup, perOp);
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
  // --blocking 1 times NCCL as it times hora: each op waited for (a stream synchronisation)
  // before the next, with a median op, so that the two latencies compare.
  Timing timeNccl() {
    return timeLoop([&](int k, std::vector<double> *stamps) {
      for (int i = 0; i < k; ++i) {
        ncclOnce();
        if (opt_.blocking) {
          cuda_->synchronize();
          if (stamps) stamps->push_back(now());
        }
      }
      if (!opt_.blocking) cuda_->synchronize();
    }, opt_.warmup, opt_.blocking);
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
  RawGloo *gloo_;
  CudaSide *cuda_ = nullptr;  // --device cuda, else nullptr
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

// One entry of --planes and what became of it.
struct Plane {
  std::string name;
  bool ran = false;
  std::string skipped;   // why it could not start
  std::string timeline;  // HORA_TIMELINE for it ("" when unset)
  double seconds = 0;    // its sweep's wall time
};

// The first plane that ran: the one the JSON's top-level hora fields and the nccl-tests footer
// describe (the same fields a run of one plane always had). -1 if none ran.
int primaryPlane(const std::vector<Plane> &planes) {
  for (size_t p = 0; p < planes.size(); ++p)
    if (planes[p].ran) return static_cast<int>(p);
  return -1;
}

void writeTiming(JsonWriter &j, const Options &o, const char *name, const Timing &g, bool hasWrong,
                 bool memcpy) {
  j.key(name);
  if (!g.ran) {
    j.null();
    return;
  }
  j.beginObject().field("time_us", g.timeUs);
  j.key("trials_us").beginArray();
  for (double us : g.trialsUs) j.value(us);
  j.endArray();
  j.field("median_us", g.medianUs);  // null where ops were not waited for one at a time
  if (memcpy) {
    j.field("gbs", g.algbw);
  } else {
    j.field("algbw_gbs", g.algbw).field("busbw_gbs", g.busbw);
  }
  if (hasWrong) {
    if (o.check) j.field("wrong", g.wrong); else j.key("wrong").null();
  }
  j.endObject();
}

void writeJson(FILE *f, const Options &o, const CollInfo &c, const DType &t, const ReduceOp &op,
               int n, const std::string &glooSkipped, bool glooRan, const std::string &mpiSkipped,
               const std::vector<Plane> &planes, const std::vector<Row> &rows, int64_t totalWrong,
               double avgBusbw) {
  const int primary = primaryPlane(planes);
  JsonWriter j(f);
  j.beginObject();
  j.field("collective", c.name).field("ranks", n).field("dtype", t.name);
  j.field("redop", c.reduces ? op.name : "none").field("root", c.coll == Coll::kBroadcast ? o.root : -1);
  j.field("iters", o.iters).field("warmup", o.warmup).field("trials", o.trials);
  j.field("blocking", o.blocking);
  j.field("device", o.device);
  j.field("launcher", launcherName());
  j.field("check", o.check).field("mpi_call", o.mpi ? c.mpiCall : "");
  if (mpiSkipped.empty()) j.key("mpi_skipped").null(); else j.field("mpi_skipped", mpiSkipped);
  j.field("gloo", glooRan);
  if (glooSkipped.empty()) j.key("gloo_skipped").null(); else j.field("gloo_skipped", glooSkipped);
  if (primary >= 0) j.field("plane", planes[primary].name); else j.key("plane").null();
  j.key("planes").beginArray();
  for (const Plane &p : planes) {
    j.beginObject().field("name", p.name).field("ran", p.ran);
    if (p.ran) j.key("skipped").null(); else j.field("skipped", p.skipped);
    j.endObject();
  }
  j.endArray();
  j.field("wrong", totalWrong).field("avg_busbw_gbs", avgBusbw);
  j.key("rows").beginArray();
  static const PlaneTiming kNone;
  for (const Row &r : rows) {
    j.beginObject();
    j.field("size", r.shape.bytes).field("count", r.shape.count).field("type", t.name);
    j.field("redop", c.reduces ? op.name : "none").field("root", c.coll == Coll::kBroadcast ? o.root : -1);
    const PlaneTiming &first = primary >= 0 ? r.planes[static_cast<size_t>(primary)] : kNone;
    writeTiming(j, o, "hora_out_of_place", first.outOfPlace, true, false);
    writeTiming(j, o, "hora_in_place", first.inPlace, true, false);
    writeTiming(j, o, "mpi", r.mpi, true, false);
    writeTiming(j, o, "gloo", r.gloo, true, false);
    writeTiming(j, o, "memcpy", r.memcpy, false, true);
    writeTiming(j, o, "nccl", r.nccl, true, false);
    const double h = first.hora().algbw;
    j.field("hora_over_mpi", h / r.mpi.algbw).field("hora_over_gloo", h / r.gloo.algbw);
    j.field("hora_over_memcpy", h / r.memcpy.algbw).field("hora_over_nccl", h / r.nccl.algbw);
    // Every plane that ran, the first one included, by name.
    j.key("hora_planes").beginObject();
    for (size_t p = 0; p < planes.size(); ++p) {
      if (!planes[p].ran) continue;
      const PlaneTiming &pt = r.planes[p];
      j.key(planes[p].name).beginObject();
      writeTiming(j, o, "out_of_place", pt.outOfPlace, true, false);
      writeTiming(j, o, "in_place", pt.inPlace, true, false);
      const double hp = pt.hora().algbw;
      j.field("over_mpi", hp / r.mpi.algbw).field("over_gloo", hp / r.gloo.algbw);
      j.field("over_memcpy", hp / r.memcpy.algbw).field("over_nccl", hp / r.nccl.algbw);
      j.field("over_first_plane", hp / first.hora().algbw);
      j.endObject();
    }
    j.endObject();
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

// One line of the plot or one column group of the table: a title and where its timing is.
struct Series {
  std::string title;
  std::function<const Timing &(const Row &)> get;
};

// busbw against size on a log2 axis, one line per column, drawn by gnuplot into `png`.
std::string plot(const std::string &png, const std::string &title, const std::vector<Row> &rows,
                 const std::vector<Series> &series) {
  const char *tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/hora-bench-plot-XXXXXX";
  if (!mkdtemp(dir.data())) return "mkdtemp: " + std::string(std::strerror(errno));
  const std::string data = dir + "/rows.dat", script = dir + "/plot.gp";
  FILE *d = std::fopen(data.c_str(), "w");
  if (!d) return "cannot write " + data + ": " + std::strerror(errno);
  for (const Row &r : rows) {
    std::fprintf(d, "%lld", static_cast<long long>(r.shape.bytes));
    for (const Series &s : series) {
      const Timing &t = s.get(r);
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
  for (size_t i = 0; i < series.size(); ++i) {
    const bool any = std::any_of(rows.begin(), rows.end(),
                                 [&](const Row &r) { return series[i].get(r).ran; });
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

// The table: its columns follow what ran. One plane: nccl-tests' own layout (out-of-place and
// in-place groups, then the raw columns and hora/X ratios). Several: a group per plane and form
// ("hora gloo out-of-place"; forms hora lacks for this collective left out), and PLANE/X ratios.
class Report {
 public:
  Report(const Options &o, const CollInfo &c, const DType &t, const ReduceOp &op,
         const std::vector<Plane> &planes, bool gloo, bool cuda)
      : o_(o), c_(c), t_(t), op_(op), planes_(planes), gloo_(gloo), cuda_(cuda) {
    for (size_t p = 0; p < planes.size(); ++p)
      if (planes[p].ran) ran_.push_back(p);
    multi_ = ran_.size() > 1;
    table_.addGroup("", {{"size", "(B)", 12}, {"count", "(elements)", 12}, {"type", "", 8},
                         {"redop", "", 6}, {"root", "", 6}});
    for (size_t p : ran_) {
      const std::string prefix = multi_ ? "hora " + planes[p].name + " " : "";
      if (!multi_ || c.horaOutOfPlace) table_.addGroup(prefix + "out-of-place", horaColumns());
      if (!multi_ || c.horaInPlace) table_.addGroup(prefix + "in-place", horaColumns());
    }
    if (o.mpi) table_.addGroup("raw MPI", rawColumns());
    if (gloo) table_.addGroup("Gloo", rawColumns());
    if (o.memcpy) table_.addGroup("memcpy", {{"time", "(us)", 7}, {"GB/s", "", 6}});
    if (cuda)  // --blocking 1 waits for each NCCL op too: a median op, as hora's
      table_.addGroup("raw NCCL", o.blocking ? rawColumns()
                                             : std::vector<Table::Column>{{"time", "(us)", 7},
                                                                          {"busbw", "(GB/s)", 6}});
    std::vector<Table::Column> ratios;
    for (size_t p : ran_) {
      const std::string who = multi_ ? planes[p].name : "hora";
      auto add = [&](const char *other) {
        const std::string name = who + "/" + other;
        ratios.push_back({name, "", std::max<int>(8, static_cast<int>(name.size()))});
      };
      if (o.mpi) add("MPI");
      if (gloo) add("Gloo");
      if (o.memcpy) add("memcpy");
      if (cuda) add("NCCL");
    }
    if (!ratios.empty()) table_.addGroup("ratios", ratios);
  }

  void printHeader(FILE *f) const { table_.printHeader(f); }

  void printRow(FILE *f, const Row &r) const {
    auto wrong = [&](const Timing &t) {
      return !t.ran ? std::string("n/a") : o_.check ? std::to_string(t.wrong) : "N/A";
    };
    std::vector<std::string> cells = {
        std::to_string(r.shape.bytes), std::to_string(r.shape.count), t_.name,
        c_.reduces ? op_.name : "none",
        std::to_string(c_.coll == Coll::kBroadcast ? o_.root : -1)};
    for (size_t p : ran_) {
      const PlaneTiming &pt = r.planes[p];
      for (const Timing *t : {&pt.outOfPlace, &pt.inPlace}) {
        if (multi_ && ((t == &pt.outOfPlace && !c_.horaOutOfPlace) ||
                       (t == &pt.inPlace && !c_.horaInPlace)))
          continue;
        cells.push_back(formatTime(t->timeUs));
        if (o_.blocking) cells.push_back(formatTime(t->medianUs));
        cells.push_back(formatFixed(t->algbw, 2));
        cells.push_back(formatFixed(t->busbw, 2));
        cells.push_back(wrong(*t));
      }
    }
    for (const Timing *t : {&r.mpi, &r.gloo}) {
      if ((t == &r.mpi && !o_.mpi) || (t == &r.gloo && !gloo_)) continue;
      cells.push_back(formatTime(t->timeUs));
      cells.push_back(formatTime(t->medianUs));
      cells.push_back(formatFixed(t->busbw, 2));
    }
    for (const Timing *t : {&r.memcpy, &r.nccl}) {
      if ((t == &r.memcpy && !o_.memcpy) || (t == &r.nccl && !cuda_)) continue;
      cells.push_back(formatTime(t->timeUs));
      if (t == &r.nccl && o_.blocking) cells.push_back(formatTime(t->medianUs));
      cells.push_back(formatFixed(t->busbw, 2));
    }
    for (size_t p : ran_) {
      const double h = r.planes[p].hora().algbw;
      if (o_.mpi) cells.push_back(ratio(h, r.mpi.algbw));
      if (gloo_) cells.push_back(ratio(h, r.gloo.algbw));
      if (o_.memcpy) cells.push_back(ratio(h, r.memcpy.algbw));
      if (cuda_) cells.push_back(ratio(h, r.nccl.algbw));
    }
    table_.printRow(f, cells);
  }

  // After the table: each plane against each column and against the first plane, as the
  // minimum, median and maximum over the sizes of algbw ratios (means of the timed loops), and
  // where both sides timed each op on its own, the same of the per-op medians.
  void printSummary(FILE *f, const std::vector<Row> &rows) const {
    if (ran_.empty() || rows.empty()) return;
    struct Other {
      std::string name;
      std::function<const Timing &(const Row &)> get;
    };
    std::vector<Other> others;
    if (o_.mpi) others.push_back({"raw MPI", [](const Row &r) -> const Timing & { return r.mpi; }});
    if (gloo_) others.push_back({"Gloo", [](const Row &r) -> const Timing & { return r.gloo; }});
    if (o_.memcpy)
      others.push_back({"memcpy", [](const Row &r) -> const Timing & { return r.memcpy; }});
    if (cuda_) others.push_back({"raw NCCL", [](const Row &r) -> const Timing & { return r.nccl; }});
    const size_t first = ran_[0];
    if (others.empty() && ran_.size() < 2) return;
    std::fprintf(f, "# summary over %zu sizes: hora's speed over each other column's, min / median "
                    "/ max; above 1, hora is faster\n", rows.size());
    std::fprintf(f, "#   means: algbw ratio (%s); medians: the other's median op / hora's (%s)\n",
                 c_.coll == Coll::kBroadcast ? "in place" : "out of place",
                 o_.blocking ? "per-op medians" : "hora's async ops have none: --blocking 1");
    auto line = [&](size_t p, const std::string &name,
                    const std::function<const Timing &(const Row &)> &get) {
      std::vector<double> means, medians;
      for (const Row &r : rows) {
        const Timing &h = r.planes[p].hora(), &x = get(r);
        if (!h.ran || !x.ran) continue;
        means.push_back(h.algbw / x.algbw);
        if (!std::isnan(h.medianUs) && !std::isnan(x.medianUs))
          medians.push_back(x.medianUs / h.medianUs);
      }
      if (means.empty()) return;
      std::fprintf(f, "#   hora %-5s over %-10s  means %s / %s / %s", planes_[p].name.c_str(),
                   name.c_str(), ratio(minOf(means), 1).c_str(), ratio(median(means), 1).c_str(),
                   ratio(maxOf(means), 1).c_str());
      if (!medians.empty())
        std::fprintf(f, "   medians %s / %s / %s", ratio(minOf(medians), 1).c_str(),
                     ratio(median(medians), 1).c_str(), ratio(maxOf(medians), 1).c_str());
      std::fprintf(f, "\n");
    };
    for (size_t p : ran_) {
      for (const Other &other : others) line(p, other.name, other.get);
      if (p != first)
        line(p, "hora " + planes_[first].name,
             [first](const Row &r) -> const Timing & { return r.planes[first].hora(); });
    }
  }

  // The plot's lines: the same columns as the table.
  std::vector<Series> series() const {
    std::vector<Series> s;
    for (size_t p : ran_) {
      const std::string prefix = "hora " + (multi_ ? planes_[p].name + " " : std::string());
      if (c_.horaOutOfPlace)
        s.push_back({prefix + "out-of-place",
                     [p](const Row &r) -> const Timing & { return r.planes[p].outOfPlace; }});
      if (c_.horaInPlace)
        s.push_back({prefix + "in-place",
                     [p](const Row &r) -> const Timing & { return r.planes[p].inPlace; }});
    }
    if (o_.mpi) s.push_back({"raw MPI", [](const Row &r) -> const Timing & { return r.mpi; }});
    if (gloo_) s.push_back({"Gloo", [](const Row &r) -> const Timing & { return r.gloo; }});
    if (o_.memcpy)
      s.push_back({"memcpy bound (GB/s per rank)",
                   [](const Row &r) -> const Timing & { return r.memcpy; }});
    if (cuda_) s.push_back({"raw NCCL", [](const Row &r) -> const Timing & { return r.nccl; }});
    return s;
  }

 private:
  static double minOf(const std::vector<double> &v) { return *std::min_element(v.begin(), v.end()); }
  static double maxOf(const std::vector<double> &v) { return *std::max_element(v.begin(), v.end()); }

  std::vector<Table::Column> horaColumns() const {
    std::vector<Table::Column> cols = {{"time", "(us)", 7}};
    if (o_.blocking) cols.push_back({"median", "(us)", 7});
    cols.insert(cols.end(), {{"algbw", "(GB/s)", 6}, {"busbw", "(GB/s)", 6}, {"#wrong", "", 5}});
    return cols;
  }
  static std::vector<Table::Column> rawColumns() {
    return {{"time", "(us)", 7}, {"median", "(us)", 7}, {"busbw", "(GB/s)", 6}};
  }

  const Options &o_;
  const CollInfo &c_;
  const DType &t_;
  const ReduceOp &op_;
  const std::vector<Plane> &planes_;
  const bool gloo_, cuda_;
  std::vector<size_t> ran_;
  bool multi_ = false;
  Table table_;
};

int run(int argc, char **argv) {
  const int rank = worldRank(), n = worldSize();
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
  const bool cudaMode = opt.device == "cuda";
  std::vector<std::string> planeNames;
  if (parsed == ParseResult::kRun) {
    if (!coll)
      error = "unknown collective " + opt.coll +
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
    else if (cudaMode && !HORA_BENCH_CUDA)
      error = "--device cuda: this build has no NCCL backend (meson found no CUDA/NCCL/nvcc)";
    else if (cudaMode && CudaSide::deviceCount() == 0)
      error = "--device cuda: no CUDA device is visible to this process";
    else if (cudaMode && !opt.planes.empty())
      error = "--planes compares CPU planes; --device cuda runs hora on NCCL";
    if (error.empty()) {
      // CUDA tensors go through NCCL whatever the CPU plane: one run, hora as launched.
      if (cudaMode)
        planeNames = {launchedBackend().empty() ? std::string("auto") : launchedBackend()};
      else if (opt.planes.empty())
        planeNames = defaultPlanes();
      else
        planeNames = parsePlanes(opt.planes, &error);
    }
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

  // On the GPU the CPU columns do not apply: the raw NCCL column takes their place. Raw MPI
  // needs an MPI launcher.
  std::string mpiSkipped;
  if (cudaMode) {
    opt.mpi = opt.gloo = opt.memcpy = false;
  } else {
    mpiSkipped = rawMpiSkipped(&opt.mpi);
  }

  const std::vector<RankInfo> ranks = gatherRanks();
  std::unique_ptr<RawGloo> gloo;
  std::string glooSkipped;
  if (opt.gloo) gloo = RawGloo::connect(rank, ranks, &glooSkipped);
  else glooSkipped = cudaMode ? "--device cuda" : "--gloo 0";

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

  std::vector<Plane> planes;
  for (size_t p = 0; p < planeNames.size(); ++p) {
    Plane pl;
    pl.name = planeNames[p];
    // The first plane traces where HORA_TIMELINE says, the others beside it (t-gloo.json).
    if (!launchedTimeline().empty())
      pl.timeline = p == 0 ? launchedTimeline() : withSuffix(launchedTimeline(), "-" + pl.name);
    planes.push_back(pl);
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
    std::string list;
    for (const std::string &p : planeNames) list += (list.empty() ? "" : ", ") + p;
    std::printf("# launched by %s; hora plane%s: %s (HORA_CPU_BACKEND; the sweep once per plane, "
                "hora_init afresh for each)\n",
                launcherName(), planeNames.size() == 1 ? "" : "s", list.c_str());
    std::printf("# hora: %s; time = mean per op, slowest rank%s%s\n",
                opt.blocking ? "blocking, each op waited for before the next (--blocking 1)"
                             : "-n ops submitted async back to back, then one wait for all",
                opt.trials == 1 ? "" : ", median of the trials",
                opt.blocking ? "; median = the median op (each op's slowest rank)" : "");
    for (const std::string &note : opt.notes) std::printf("# note: %s\n", note.c_str());
    // A timed loop names -n ops: past the response cache's capacity every op negotiates through
    // the coordinator, which a training step (whose names repeat) does not.
    const char *capacityText = std::getenv("HORA_CACHE_CAPACITY");
    const long cacheCapacity = capacityText != nullptr ? std::atol(capacityText) : kDefaultCacheCapacity;
    if (!opt.blocking && opt.iters > cacheCapacity)
      std::printf("# note: -n %d names more ops than the response cache holds "
                  "(HORA_CACHE_CAPACITY=%ld): hora's columns time its coordinator, not the cached "
                  "path; raise HORA_CACHE_CAPACITY to time that\n",
                  opt.iters, cacheCapacity);
    if (opt.mpi)
      std::printf("# raw MPI: %s, blocking calls on the same buffers%s\n", coll->mpiCall,
                  !coll->reduces ? ""
                  : op->hora == HORA_OP_AVERAGE ? " (avg timed as a sum)"
                  : type->mpi == MPI_DATATYPE_NULL ? " (a user op on 16-bit words)" : "");
    else if (!cudaMode)
      std::printf("# raw MPI column skipped: %s\n", mpiSkipped.c_str());
    if (gloo)
      std::printf("# Gloo: %s, blocking calls, tcp over %s%s\n", coll->glooCall,
                  gloo->address().c_str(),
                  coll->reduces && op->hora == HORA_OP_AVERAGE ? " (avg timed as a sum)" : "");
    else
      std::printf("# Gloo column skipped: %s\n", glooSkipped.c_str());
    if (opt.mpi || gloo)
      std::printf("# raw columns: time = mean per op; median = the median op (each op's slowest "
                  "rank)\n");
    if (opt.memcpy)
      std::printf("# memcpy: every rank copies size bytes at once; GB/s = size / time\n");
    if (cudaMode)
      std::printf("# --device cuda: every tensor on the rank's GPU (local rank %% GPUs); raw NCCL: "
                  "%s, on the same buffers\n",
                  opt.blocking ? "each op then a stream synchronisation; median = the median op"
                               : "-n ops on one stream, one synchronisation");
    std::printf("# busbw = algbw x %s; ratios: hora's algbw (%s) over the column's\n",
                coll->coll == Coll::kAllreduce ? "2(n-1)/n" : bcast ? "1" : "(n-1)/n",
                bcast ? "in place" : "out of place");
    printRanks(stdout, ranks);
    std::printf("#\n");
    std::fflush(stdout);
  }

  std::vector<Row> rows(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    rows[i].shape = shapes[i];
    rows[i].planes.resize(planes.size());
  }
  const bool anyRaw = opt.mpi || gloo || opt.memcpy || cudaMode;
  // One plane asked for: rows stream out as they are measured, as nccl-tests prints them.
  // Several: the table follows once every plane ran.
  const bool streaming = planes.size() == 1;
  std::unique_ptr<Report> report;
  std::unique_ptr<CudaSide> cuda;
  {
    Bench bench(opt, *coll, *type, *op, rank, n, capacity, gloo.get());
    bool rawDone = !anyRaw;
    for (Plane &plane : planes) {
      if (!startPlane(plane.name, plane.timeline, &plane.skipped)) continue;
      plane.ran = true;
      if (cudaMode && !cuda) {
        try {
          cuda = std::make_unique<CudaSide>(hora_local_rank(), capacity, capacity);
        } catch (const std::exception &e) {
          failHere(std::string("--device cuda: ") + e.what());
        }
        bench.setCuda(cuda.get());
      }
      if (streaming && rank == 0) {
        report = std::make_unique<Report>(opt, *coll, *type, *op, planes, gloo != nullptr,
                                          cuda != nullptr);
        report->printHeader(stdout);
        std::fflush(stdout);
      }
      const size_t p = static_cast<size_t>(&plane - planes.data());
      const double t0 = now();
      // A runtime's first ops are cold (code, allocator, the engine's first cycles); nccl-tests
      // too warms up at the smallest size first. Bandwidth-bound sizes need no such pass.
      PlaneTiming scratch;
      Row scratchRow;
      if (!shapes.empty() && shapes.front().bytes <= kColdPassMaxBytes)
        bench.run(shapes.front(), true, !rawDone, &scratch, &scratchRow);
      for (size_t i = 0; i < rows.size(); ++i) {
        Row &r = rows[i];
        bench.run(r.shape, true, !rawDone, &r.planes[p], &r);
        if (report) {
          report->printRow(stdout, r);
          std::fflush(stdout);
        } else if (rank == 0) {
          // Several planes: the table needs every plane, so each size says it is done here.
          const Timing &t = r.planes[p].hora();
          std::printf("# hora on %s: size %zu/%zu, %lld bytes, %.1f us per op, %.2f GB/s busbw\n",
                      plane.name.c_str(), i + 1, rows.size(),
                      static_cast<long long>(r.shape.bytes), t.timeUs, t.busbw);
          std::fflush(stdout);
        }
      }
      rawDone = true;
      plane.seconds = now() - t0;
      if (rank == 0 && !streaming) {
        std::printf("# hora on %s: %zu sizes in %.1f s\n", plane.name.c_str(), rows.size(),
                    plane.seconds);
        std::fflush(stdout);
      }
    }
    if (cudaMode && !cuda) failHere("--device cuda: hora could not start: " + planes[0].skipped);
    if (!rawDone) {
      // No plane ran: the raw columns alone, while the harness world (if any) idles.
      stopHora();
      for (Row &r : rows) bench.run(r.shape, false, true, nullptr, &r);
    }
  }
  if (rank == 0 && !report) {
    report = std::make_unique<Report>(opt, *coll, *type, *op, planes, gloo != nullptr,
                                      cuda != nullptr);
    report->printHeader(stdout);
    for (const Row &r : rows) report->printRow(stdout, r);
  }

  // nccl-tests' footer: the average over every hora bus bandwidth printed (both forms) of the
  // first plane that ran; with several planes, each plane's too.
  const int primary = primaryPlane(planes);
  int64_t horaWrong = 0, baselineWrong = 0;
  std::vector<double> planeBusSum(planes.size(), 0);
  std::vector<int> planeBusCount(planes.size(), 0);
  double mpiSum = 0, glooSum = 0, ncclSum = 0;
  int mpiCount = 0, glooCount = 0, ncclCount = 0;
  for (const Row &r : rows) {
    for (size_t p = 0; p < planes.size(); ++p) {
      for (const Timing *t : {&r.planes[p].outOfPlace, &r.planes[p].inPlace}) {
        if (!t->ran) continue;
        horaWrong += t->wrong;
        planeBusSum[p] += t->busbw;
        ++planeBusCount[p];
      }
    }
    baselineWrong += r.mpi.wrong + r.gloo.wrong + r.nccl.wrong;
    if (r.nccl.ran) ncclSum += r.nccl.busbw, ++ncclCount;
    if (r.mpi.ran) mpiSum += r.mpi.busbw, ++mpiCount;
    if (r.gloo.ran) glooSum += r.gloo.busbw, ++glooCount;
  }
  auto avgOf = [&](int p) {
    return p >= 0 && planeBusCount[p] ? planeBusSum[p] / planeBusCount[p] : std::nan("");
  };
  const double avgBus = avgOf(primary);
  int status = horaWrong || baselineWrong ? 1 : 0;
  if (primary < 0) status = 1;  // nothing of hora was measured
  if (rank == 0) {
    report->printSummary(stdout, rows);
    for (const Plane &plane : planes)
      if (!plane.ran)
        std::printf("# hora on %s: skipped: %s\n", plane.name.c_str(), plane.skipped.c_str());
    if (primary < 0) std::printf("# no hora plane could start\n");
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(horaWrong),
                !opt.check ? "(not checked)" : horaWrong ? "FAILED" : "OK");
    if (baselineWrong)
      std::printf("# MPI, Gloo or NCCL results wrong: %lld (a bug in the benchmark or the library)\n",
                  static_cast<long long>(baselineWrong));
    std::printf("# Avg bus bandwidth    : %g\n", avgBus);
    int ran = 0;
    for (const Plane &plane : planes) ran += plane.ran;
    if (ran > 1)
      for (size_t p = 0; p < planes.size(); ++p)
        if (planes[p].ran)
          std::printf("# Avg hora %s bus bandwidth: %g\n", planes[p].name.c_str(),
                      avgOf(static_cast<int>(p)));
    if (mpiCount) std::printf("# Avg MPI bus bandwidth: %g\n", mpiSum / mpiCount);
    if (glooCount) std::printf("# Avg Gloo bus bandwidth: %g\n", glooSum / glooCount);
    if (ncclCount) std::printf("# Avg NCCL bus bandwidth: %g\n", ncclSum / ncclCount);
    std::printf("#\n");
    std::fflush(stdout);
    if (!opt.json.empty() && !writeReport(opt.json, [&](FILE *f) {
          writeJson(f, opt, *coll, *type, *op, n, glooSkipped, gloo != nullptr, mpiSkipped, planes,
                    rows, horaWrong + baselineWrong, avgBus);
        }))
      status = 2;
    if (!opt.plot.empty()) {
      const std::string title = std::string("hora-bench ") + coll->name + ", " +
                                std::to_string(n) + " ranks, " + type->name +
                                (coll->reduces ? std::string(" ") + op->name : std::string());
      const std::string why = plot(opt.plot, title, rows, report->series());
      if (!why.empty()) {
        std::fprintf(stderr, "%s: --plot %s: %s\n", programName(), opt.plot.c_str(), why.c_str());
        status = 2;
      } else {
        std::printf("# plot: %s\n", opt.plot.c_str());
      }
    }
  }
  broadcastBytes(&status, sizeof status);
  gloo.reset();
  cuda.reset();
  return status;
}

}  // namespace
}  // namespace hora::bench

int main(int argc, char **argv) {
  return hora::bench::runBenchmark(argc, argv, "hora-bench", hora::bench::run);
}
