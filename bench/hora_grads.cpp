// SPDX-License-Identifier: Apache-2.0
// hora-grads: one data-parallel gradient step of a real model's tensors, hora on each plane
// against raw MPI and Gloo, or on the GPU against raw NCCL.

#include "bench_cuda.h"
#include "bench_util.h"
#include "raw_gloo.h"
#include "world.h"

#include <hora/hora.h>

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

// Where the default workloads are: the source tree's bench/data, else where meson installed them.
#ifndef HORA_GRADS_DATA_DIR
#define HORA_GRADS_DATA_DIR "bench/data"
#endif
#ifndef HORA_GRADS_INSTALLED_DIR
#define HORA_GRADS_INSTALLED_DIR "/usr/local/share/hora"
#endif
#ifndef HORA_BENCH_CUDA
#define HORA_BENCH_CUDA 0
#endif

namespace hora::bench {
namespace {

constexpr const char *kFusionKnob = "HORA_FUSION_THRESHOLD";

struct Options {
  std::vector<std::string> models;
  int steps = 20;
  int warmup = 3;
  int latencyIters = 200;
  bool check = true;
  bool mpi = true, gloo = true;
  std::string planes;  // --planes, "" = defaultPlanes()
  std::string device = "cpu";  // cpu, or cuda: the gradients on the GPU against raw NCCL
  std::string json;
};

// hora-grads --device cuda where this process sees no GPU: what a test harness reads as "skipped".
constexpr int kExitNoDevice = 77;
// --device cuda in a build without NCCL.
constexpr int kExitNoNccl = 2;

void usage(FILE *f) {
  std::fprintf(
      f,
      "usage: mpirun -np N hora-grads [--model FILE]... [--steps N] [--warmup N] [--latency N]\n"
      "         [--planes LIST] [--mpi 0|1] [--gloo 0|1] [--device cpu|cuda] [-c 0|1]\n"
      "         [--json FILE]\n"
      "   or: tools/horarun -np N hora-grads ...   (or torchrun-style variables: MASTER_ADDR,\n"
      "       MASTER_PORT, RANK, WORLD_SIZE; or srun)\n"
      "\n"
      "  --model FILE  a model's gradient tensors: one '#' comment line, then one 'name dims'\n"
      "                line per tensor, dims joined by 'x' (float32). Repeatable. Default:\n"
      "                resnet50_grads.txt and vit_b_16_grads.txt in\n"
      "                " HORA_GRADS_DATA_DIR "\n"
      "                (once installed: " HORA_GRADS_INSTALLED_DIR ")\n"
      "  --steps N     timed steps per variant (default 20)\n"
      "  --warmup N    untimed steps before them (default 3)\n"
      "  --latency N   4-byte allreduces for the latency lines (default 200; 0 skips them)\n"
      "  --planes LIST hora's CPU planes, comma-separated: mpi, gloo, ucx (or auto). Default: mpi\n"
      "                (under an MPI launcher only), gloo (where built), ucx; only the launched\n"
      "                one where HORA_CPU_BACKEND is set. Each plane: hora_shutdown,\n"
      "                HORA_CPU_BACKEND=PLANE, hora_init; one that cannot start is reported as\n"
      "                skipped, with hora's reason. PLANE:hier / PLANE:flat run it with\n"
      "                HORA_HIERARCHICAL=on / off, PLANE:horovod hierarchically with one rank\n"
      "                per host across (Horovod's way)\n"
      "  --mpi 0, --gloo 0   drop the raw MPI (only under an MPI launcher anyway) or Gloo rows\n"
      "  --device cuda the gradients on the GPU (local rank modulo the GPUs seen), hora on NCCL,\n"
      "                against raw NCCL on the same buffers (below); --planes, --mpi, --gloo and\n"
      "                --latency do not apply. Runs without mpirun too: one process is a world\n"
      "                of one. Exits 77 where a rank sees no GPU, 2 in a build without NCCL\n"
      "  -c, --check   verify the last step of every variant (default 1)\n"
      "  --json FILE   every figure as JSON (written by rank 0)\n"
      "\n"
      "One step, as data-parallel training runs it: every tensor of the model allreduced (sum, in\n"
      "place, on one contiguous gradient buffer), submitted in REVERSE order (as backpropagation\n"
      "produces them), then a wait for all. Rows, per model:\n"
      "  hora P (fusion on)   on plane P: hora_allreduce_async per tensor with the knobs as\n"
      "                       launched (defaults unless HORA_* variables say otherwise), then\n"
      "                       hora_wait on each\n"
      "  hora P (fusion off)  the same after hora_shutdown, HORA_FUSION_THRESHOLD=0, hora_init\n"
      "                       (with HORA_TIMELINE=t.json set, the first plane traces into t.json\n"
      "                       and t-fusion-off.json, a later plane P into t-P.json and\n"
      "                       t-P-fusion-off.json)\n"
      "  MPI per tensor       a blocking MPI_Allreduce(MPI_IN_PLACE) per tensor, reverse order\n"
      "  MPI flat             one MPI_Allreduce of the whole gradient buffer\n"
      "  Gloo per tensor/flat the same through Gloo's own allreduce on its own TCP mesh\n"
      "Step time: a barrier, the step, then the slowest rank's elapsed time; the table gives the\n"
      "median, the mean (a stall the median hides shows there) and the minimum over the steps.\n"
      "GB/s = gradient bytes / median step time. vs hora = the row's median / the first plane's\n"
      "hora (fusion on) median: above 1, that hora is faster.\n"
      "Latency: a blocking 4-byte allreduce (hora: submit + wait), each call's slowest rank, the\n"
      "median and the mean over N calls, per plane, against MPI_Allreduce and Gloo's allreduce.\n"
      "\n"
      "--device cuda: one gradient buffer in device memory, each tensor a slice of it; hora as\n"
      "launched (its fusion knobs as set), on the benchmark's stream (hora_cuda_set_stream). Rows:\n"
      "  hora (NCCL)          hora_allreduce_async per tensor (kDLCUDA), reverse order, then\n"
      "                       hora_wait on each\n"
      "  NCCL per tensor      one ncclAllReduce per tensor in place, reverse order, queued back to\n"
      "                       back on one stream, then one stream synchronisation\n"
      "  NCCL flat (1 call)   one ncclAllReduce of the whole buffer, then the synchronisation\n"
      "Below the table, per model: hora / NCCL per tensor (median and mean) and hora's cost per\n"
      "tensor above it, (hora - NCCL per tensor) / tensors. The check fills tensor i on rank r\n"
      "with (r + 1)(i mod 97 + 1) + (element mod 7) and compares the sums on the host.\n");
}

std::vector<OptionSpec> optionSpecs(Options *o) {
  auto integer = [](int *dst, int64_t lo) {
    return [dst, lo](const char *v) -> std::string {
      int64_t n = 0;
      if (!parseInt(v, lo, INT_MAX, &n)) return "expected an integer >= " + std::to_string(lo);
      *dst = static_cast<int>(n);
      return "";
    };
  };
  return {
      {{"--model", "-m"},
       [o](const char *v) -> std::string {
         if (!*v) return "empty";
         o->models.push_back(v);
         return "";
       }},
      {{"--steps"}, integer(&o->steps, 1)},
      {{"--warmup"}, integer(&o->warmup, 0)},
      {{"--latency"}, integer(&o->latencyIters, 0)},
      {{"--planes"},
       [o](const char *v) -> std::string {
         if (!*v) return "empty";
         o->planes = v;
         return "";
       }},
      {{"--mpi"},
       [o](const char *v) -> std::string {
         int64_t n = 0;
         if (!parseInt(v, 0, 1, &n)) return "expected 0 or 1";
         o->mpi = n != 0;
         return "";
       }},
      {{"--gloo"},
       [o](const char *v) -> std::string {
         int64_t n = 0;
         if (!parseInt(v, 0, 1, &n)) return "expected 0 or 1";
         o->gloo = n != 0;
         return "";
       }},
      {{"--device"},
       [o](const char *v) -> std::string {
         if (std::strcmp(v, "cpu") != 0 && std::strcmp(v, "cuda") != 0) return "expected cpu or cuda";
         o->device = v;
         return "";
       }},
      {{"-c", "--check"},
       [o](const char *v) -> std::string {
         int64_t n = 0;
         if (!parseInt(v, 0, 1, &n)) return "expected 0 or 1";
         o->check = n != 0;
         return "";
       }},
      {{"--json"},
       [o](const char *v) -> std::string {
         if (!*v) return "empty";
         o->json = v;
         return "";
       }},
  };
}

// ---- models ------------------------------------------------------------------------------------

struct Tensor {
  std::string name;
  int64_t numel = 0;
  int64_t offset = 0;  // elements into the model's gradient buffer
};

struct Model {
  std::string name, file;
  std::vector<Tensor> tensors;
  int64_t elems = 0;
  int64_t bytes() const { return elems * 4; }
};

// Rank 0 reads the file and broadcasts it, so that every rank parses the same text and a bad
// file gives one message.
bool readOnRoot(const std::string &path, int rank, std::string *text, std::string *error) {
  std::string failure;  // rank 0's reason, sent to every rank
  if (rank == 0) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      failure = "cannot read " + path + ": " + std::strerror(errno);
    } else {
      std::ostringstream s;
      s << in.rdbuf();
      *text = s.str();
    }
  }
  broadcastString(&failure);
  if (!failure.empty()) {
    if (rank == 0) *error = failure;
    return false;
  }
  broadcastString(text);
  return true;
}

bool parseModel(const std::string &path, const std::string &text, Model *m, std::string *error) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  for (const char *suffix : {"_grads.txt", ".txt"}) {
    const size_t len = std::strlen(suffix);
    if (base.size() > len && base.compare(base.size() - len, len, suffix) == 0) {
      base.resize(base.size() - len);
      break;
    }
  }
  m->name = base;
  m->file = path;
  std::istringstream in(text);
  std::string line;
  std::set<std::string> seen;
  int lineNo = 0;
  auto bad = [&](const std::string &why) {
    *error = path + ":" + std::to_string(lineNo) + ": " + why;
    return false;
  };
  while (std::getline(in, line)) {
    ++lineNo;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    std::istringstream fields(line);
    std::string name, dims, extra;
    fields >> name >> dims;
    if (dims.empty()) return bad("expected 'name dims' (dims joined by 'x'), got '" + line + "'");
    if (fields >> extra) return bad("unexpected '" + extra + "' after the dims");
    if (!seen.insert(name).second) return bad("tensor " + name + " appears twice");
    int64_t numel = 1;
    size_t start = 0;
    while (true) {
      const size_t x = dims.find('x', start);
      const std::string d = dims.substr(start, x == std::string::npos ? x : x - start);
      int64_t v = 0;
      if (!parseInt(d.c_str(), 1, INT64_C(1) << 40, &v))
        return bad("bad dimension '" + d + "' in '" + dims + "'");
      numel *= v;
      if (numel > (INT64_C(1) << 40)) return bad("tensor " + name + " is too large");
      if (x == std::string::npos) break;
      start = x + 1;
    }
    m->tensors.push_back({name, numel, m->elems});
    m->elems += numel;
  }
  if (m->tensors.empty()) {
    *error = path + ": no tensors";
    return false;
  }
  return true;
}

// ---- the variants ------------------------------------------------------------------------------

struct Result {
  bool ran = false;
  std::vector<double> stepMs;  // slowest rank, per timed step
  double medianMs = std::nan(""), meanMs = std::nan(""), minMs = std::nan(""), gbs = std::nan("");
  int64_t wrong = 0;  // summed over ranks
};

// The raw rows, after every plane's two hora rows.
enum Raw { kMpiPerTensor, kMpiFlat, kGlooPerTensor, kGlooFlat, kRaws };
const char *const kRawLabels[kRaws] = {"MPI per tensor", "MPI flat (1 call)", "Gloo per tensor",
                                       "Gloo flat (1 call)"};
const char *const kRawKeys[kRaws] = {"mpi_per_tensor", "mpi_flat", "gloo_per_tensor", "gloo_flat"};

// Warm-up steps, then timed ones. The sums grow step by step (in place); the buffer is filled
// afresh, untimed, before the last step, whose result is then checked.
Result measureSteps(const Options &opt, int64_t bytes, const std::function<void()> &step,
                    const std::function<void()> &fill,
                    const std::function<int64_t()> &countWrong) {
  Result r;
  r.ran = true;
  for (int i = 0; i < opt.warmup; ++i) step();
  for (int i = 0; i < opt.steps; ++i) {
    if (opt.check && i == opt.steps - 1) fill();
    barrier();
    const double t0 = now();
    step();
    r.stepMs.push_back(slowestRank(now() - t0) * 1e3);
  }
  if (opt.check) r.wrong = sumOverRanks(countWrong());
  r.medianMs = median(r.stepMs);
  r.meanMs = mean(r.stepMs);
  r.minMs = *std::min_element(r.stepMs.begin(), r.stepMs.end());
  r.gbs = static_cast<double>(bytes) / (r.medianMs * 1e6);
  return r;
}

// hora's step over one model's gradients, wherever they lie: every tensor submitted in place in
// backprop order (the reverse of the file's), then each waited for.
class HoraStep {
 public:
  explicit HoraStep(const Model &m) : m_(m) {
    for (const Tensor &t : m.tensors) {
      names_.push_back("grads." + m.name + "." + t.name);
      shapes_.push_back(t.numel);
    }
    requests_.resize(m.tensors.size());
  }

  void run(float *grads, DLDevice device) {
    const size_t count = m_.tensors.size();
    for (size_t i = count; i-- > 0;) {
      DLTensor t = cpuTensor(grads + m_.tensors[i].offset, DLDataType{kDLFloat, 32, 1}, &shapes_[i]);
      t.device = device;
      checkHora(hora_allreduce_async(names_[i].c_str(), &t, &t, HORA_OP_SUM, 1.0, 1.0, 0,
                                     &requests_[count - 1 - i]),
                "hora_allreduce_async");
    }
    for (hora_request_t &r : requests_) {
      checkHora(hora_wait(r), "hora_wait");
      hora_request_free(r);
      r = nullptr;
    }
  }

 private:
  const Model &m_;
  std::vector<std::string> names_;
  std::vector<int64_t> shapes_;
  std::vector<hora_request_t> requests_;
};

// One model's gradient buffer (float32, one allocation; each tensor a slice of it) and the steps
// that reduce it.
class Step {
 public:
  Step(const Model &m, int rank, int n) : m_(m), grads_(static_cast<size_t>(m.bytes())), hora_(m) {
    // Every input and result element depends on its index mod 7 only (see reduceInput).
    for (int j = 0; j < 7; ++j) {
      input_[j] = static_cast<float>(reduceInput(HORA_OP_SUM, rank, n, j));
      expected_[j] = static_cast<float>(reduceExpected(HORA_OP_SUM, n, j));
    }
    fill();
  }

  float *data() const { return reinterpret_cast<float *>(grads_.data()); }

  void fill() {
    float *g = data();
    for (int64_t k = 0, j = 0; k < m_.elems; ++k, j = j == 6 ? 0 : j + 1) g[k] = input_[j];
  }

  int64_t countWrong() const {
    const float *g = data();
    int64_t wrong = 0;
    for (int64_t k = 0, j = 0; k < m_.elems; ++k, j = j == 6 ? 0 : j + 1)
      wrong += g[k] != expected_[j];
    return wrong;
  }

  void hora() { hora_.run(data(), DLDevice{kDLCPU, 0}); }

  void mpiPerTensor() {
    for (size_t i = m_.tensors.size(); i-- > 0;)
      MPI_Allreduce(MPI_IN_PLACE, data() + m_.tensors[i].offset,
                    static_cast<int>(m_.tensors[i].numel), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }

  void mpiFlat() {
    MPI_Allreduce(MPI_IN_PLACE, data(), static_cast<int>(m_.elems), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  }

  void glooPerTensor(RawGloo &gloo) {
    const ReduceFn sum = reduceFunction(Kind::kF32, HORA_OP_SUM);
    for (size_t i = m_.tensors.size(); i-- > 0;) {
      float *t = data() + m_.tensors[i].offset;
      gloo.allreduce(t, t, m_.tensors[i].numel, 4, sum);
    }
  }

  void glooFlat(RawGloo &gloo) {
    gloo.allreduce(data(), data(), m_.elems, 4, reduceFunction(Kind::kF32, HORA_OP_SUM));
  }

  Result measure(const Options &opt, const std::function<void()> &step) {
    return measureSteps(opt, m_.bytes(), step, [this] { fill(); }, [this] { return countWrong(); });
  }

 private:
  const Model &m_;
  Buffer grads_;
  HoraStep hora_;
  float input_[7], expected_[7];
};

// --device cuda: the model's gradient buffer in device memory (CudaSide's send buffer; each
// tensor a slice, as on the CPU) and the steps that reduce it, hora on NCCL and raw NCCL. A copy
// of it on the host fills it and checks it.
class CudaStep {
 public:
  CudaStep(const Model &m, CudaSide &cuda, int rank, int n)
      : m_(m), cuda_(cuda), rank_(rank), n_(n), host_(static_cast<size_t>(m.bytes())), hora_(m) {
    fill();
  }

  float *device() const { return static_cast<float *>(cuda_.send()); }

  // Tensor i, element k on rank r: (r + 1)(i mod 97 + 1) + k mod 7. A tensor's values name the
  // tensor and the rank, and the element's place in it; the sums stay small integers, exact in
  // float32 whatever order NCCL adds in.
  void fill() {
    float *h = reinterpret_cast<float *>(host_.data());
    for (size_t i = 0; i < m_.tensors.size(); ++i) {
      const float base = static_cast<float>((rank_ + 1) * (static_cast<int64_t>(i) % 97 + 1));
      float *t = h + m_.tensors[i].offset;
      for (int64_t k = 0, j = 0; k < m_.tensors[i].numel; ++k, j = j == 6 ? 0 : j + 1)
        t[k] = base + static_cast<float>(j);
    }
    cuda_.upload(device(), h, static_cast<size_t>(m_.bytes()));
  }

  int64_t countWrong() {
    float *h = reinterpret_cast<float *>(host_.data());
    cuda_.download(h, device(), static_cast<size_t>(m_.bytes()));
    const int64_t ranks = n_;
    int64_t wrong = 0;
    for (size_t i = 0; i < m_.tensors.size(); ++i) {
      const float base =
          static_cast<float>((static_cast<int64_t>(i) % 97 + 1) * ranks * (ranks + 1) / 2);
      const float *t = h + m_.tensors[i].offset;
      for (int64_t k = 0, j = 0; k < m_.tensors[i].numel; ++k, j = j == 6 ? 0 : j + 1)
        wrong += t[k] != base + static_cast<float>(ranks * j);
    }
    return wrong;
  }

  void hora() { hora_.run(device(), DLDevice{kDLCUDA, cuda_.device()}); }

  // As nccl-tests queues its ops: back to back on one stream, one synchronisation.
  void ncclPerTensor() {
    for (size_t i = m_.tensors.size(); i-- > 0;)
      cuda_.allreduceInPlace(device() + m_.tensors[i].offset, m_.tensors[i].numel, "float", "sum");
    cuda_.synchronize();
  }

  void ncclFlat() {
    cuda_.allreduceInPlace(device(), m_.elems, "float", "sum");
    cuda_.synchronize();
  }

  Result measure(const Options &opt, const std::function<void()> &step) {
    return measureSteps(opt, m_.bytes(), step, [this] { fill(); }, [this] { return countWrong(); });
  }

 private:
  const Model &m_;
  CudaSide &cuda_;
  const int rank_, n_;
  Buffer host_;
  HoraStep hora_;
};

// One --planes entry and what it measured.
struct Plane {
  std::string name;
  bool ran = false;
  std::string skipped;
  std::string timelineOn, timelineOff;  // "" when HORA_TIMELINE is unset
  double latencyMedianUs = std::nan(""), latencyMeanUs = std::nan("");
  std::vector<Result> fused, unfused;  // per model
};

// Blocking 4-byte allreduces: a few untimed, then `iters` each timed on every rank; each call's
// time is its slowest rank's. Median and mean, in us.
struct Latency {
  double medianUs = std::nan(""), meanUs = std::nan("");
};
template <typename F>
Latency latency(int iters, F &&once) {
  for (int i = 0; i < std::min(iters, 20); ++i) once();
  barrier();
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now();
    once();
    us.push_back((now() - t0) * 1e6);
  }
  maxOverRanks(us.data(), us.size());
  return {median(us), mean(us)};
}

struct ModelResult {
  Model model;
  Result raw[kRaws];
};

std::string ratioText(double num, double den) {
  const double r = num / den;
  return std::isfinite(r) ? formatFixed(r, 2) : "n/a";
}

void writeResult(JsonWriter &j, const Options &o, const char *key, const Result &r) {
  j.key(key);
  if (!r.ran) {
    j.null();
    return;
  }
  j.beginObject().field("median_ms", r.medianMs).field("mean_ms", r.meanMs);
  j.field("min_ms", r.minMs).field("gbs", r.gbs);
  if (o.check) j.field("wrong", r.wrong); else j.key("wrong").null();
  j.key("steps_ms").beginArray();
  for (double ms : r.stepMs) j.value(ms);
  j.endArray().endObject();
}

void writeJson(FILE *f, const Options &o, int n, const char *fusionEnv,
               const std::vector<Plane> &planes, int primary, const Latency &mpiLat,
               const Latency &glooLat, const std::string &mpiSkipped,
               const std::string &glooSkipped, const std::vector<ModelResult> &results) {
  static const Result kNone;
  const Plane *first = primary >= 0 ? &planes[static_cast<size_t>(primary)] : nullptr;
  JsonWriter j(f);
  j.beginObject();
  j.field("ranks", n).field("steps", o.steps).field("warmup", o.warmup);
  j.field("dtype", "float32").field("op", "sum").field("check", o.check);
  j.field("launcher", launcherName());
  if (fusionEnv) j.field("fusion_threshold_env", fusionEnv); else j.key("fusion_threshold_env").null();
  if (first) j.field("plane", first->name); else j.key("plane").null();
  j.key("planes").beginArray();
  for (const Plane &p : planes) {
    j.beginObject().field("name", p.name).field("ran", p.ran);
    if (p.ran) j.key("skipped").null(); else j.field("skipped", p.skipped);
    j.endObject();
  }
  j.endArray();
  if (mpiSkipped.empty()) j.key("mpi_skipped").null(); else j.field("mpi_skipped", mpiSkipped);
  if (glooSkipped.empty()) j.key("gloo_skipped").null(); else j.field("gloo_skipped", glooSkipped);
  const double horaLat = first ? first->latencyMedianUs : std::nan("");
  j.key("latency").beginObject().field("iters", o.latencyIters).field("hora_us", horaLat);
  j.field("hora_mean_us", first ? first->latencyMeanUs : std::nan(""));
  j.field("mpi_us", mpiLat.medianUs).field("mpi_mean_us", mpiLat.meanUs);
  j.field("gloo_us", glooLat.medianUs).field("gloo_mean_us", glooLat.meanUs);
  j.field("hora_over_mpi", horaLat / mpiLat.medianUs);
  j.key("hora_planes").beginObject();
  for (const Plane &p : planes) {
    if (!p.ran) continue;
    j.key(p.name).beginObject().field("median_us", p.latencyMedianUs);
    j.field("mean_us", p.latencyMeanUs).endObject();
  }
  j.endObject().endObject();
  j.key("models").beginArray();
  for (size_t m = 0; m < results.size(); ++m) {
    const ModelResult &mr = results[m];
    const Model &model = mr.model;
    j.beginObject().field("name", model.name).field("file", model.file);
    j.field("tensors", static_cast<int64_t>(model.tensors.size())).field("elements", model.elems);
    j.field("bytes", model.bytes());
    const Result &on = first ? first->fused[m] : kNone, &off = first ? first->unfused[m] : kNone;
    writeResult(j, o, "hora_fusion_on", on);
    writeResult(j, o, "hora_fusion_off", off);
    for (int v = 0; v < kRaws; ++v) writeResult(j, o, kRawKeys[v], mr.raw[v]);
    j.key("hora_planes").beginObject();
    for (const Plane &p : planes) {
      if (!p.ran) continue;
      j.key(p.name).beginObject();
      writeResult(j, o, "fusion_on", p.fused[m]);
      writeResult(j, o, "fusion_off", p.unfused[m]);
      j.field("over_first_plane", p.fused[m].medianMs / on.medianMs);
      j.endObject();
    }
    j.endObject();
    j.field("mpi_per_tensor_over_hora", mr.raw[kMpiPerTensor].medianMs / on.medianMs);
    j.field("mpi_flat_over_hora", mr.raw[kMpiFlat].medianMs / on.medianMs);
    j.field("gloo_per_tensor_over_hora", mr.raw[kGlooPerTensor].medianMs / on.medianMs);
    j.field("gloo_flat_over_hora", mr.raw[kGlooFlat].medianMs / on.medianMs);
    j.field("fusion_off_over_on", off.medianMs / on.medianMs);
    j.endObject();
  }
  j.endArray();
  j.endObject();
}

// ---- --device cuda -----------------------------------------------------------------------------

enum CudaVariant { kHoraNccl, kNcclPerTensor, kNcclFlat, kCudaVariants };
const char *const kCudaLabels[kCudaVariants] = {"hora (NCCL)", "NCCL per tensor",
                                                "NCCL flat (1 call)"};
const char *const kCudaKeys[kCudaVariants] = {"hora", "nccl_per_tensor", "nccl_flat"};

struct CudaModelResult {
  const Model *model;
  Result r[kCudaVariants];
};

// What hora's step costs per tensor above raw NCCL's per-tensor calls, in us: the engine's and
// fusion's share of a step, spread over its tensors (negative where fusion gains more).
double usPerTensorAbove(double horaMs, double ncclMs, const Model &m) {
  return (horaMs - ncclMs) * 1e3 / static_cast<double>(m.tensors.size());
}

// --device cuda where it cannot run: kExitNoNccl in a build without NCCL, kExitNoDevice where a
// rank sees no GPU (rank 0 says why, on stderr); 0 where it can. Collective.
int cudaUnavailable(int rank, int n) {
  if (!HORA_BENCH_CUDA) {
    if (rank == 0)
      std::fprintf(stderr, "%s: --device cuda: this build has no NCCL backend (meson found no "
                   "CUDA, NCCL or nvcc)\n", programName());
    return kExitNoNccl;
  }
  const std::string why = CudaSide::whyNoDevice();
  const int64_t without = sumOverRanks(static_cast<int64_t>(!why.empty()));
  if (without == 0) return 0;
  if (rank == 0) {
    if (!why.empty())
      std::fprintf(stderr, "%s: no CUDA device: %s\n", programName(), why.c_str());
    else
      std::fprintf(stderr, "%s: no CUDA device on %lld of %d ranks\n", programName(),
                   static_cast<long long>(without), n);
  }
  return kExitNoDevice;
}

void writeCudaJson(FILE *f, const Options &o, int n, const char *fusionEnv,
                   const std::string &plane, int device,
                   const std::vector<CudaModelResult> &results) {
  JsonWriter j(f);
  j.beginObject();
  j.field("device", "cuda").field("ranks", n).field("steps", o.steps).field("warmup", o.warmup);
  j.field("dtype", "float32").field("op", "sum").field("check", o.check);
  j.field("launcher", launcherName()).field("plane", plane).field("gpu", device);
  if (fusionEnv) j.field("fusion_threshold_env", fusionEnv); else j.key("fusion_threshold_env").null();
  j.key("models").beginArray();
  for (const CudaModelResult &mr : results) {
    const Model &m = *mr.model;
    j.beginObject().field("name", m.name).field("file", m.file);
    j.field("tensors", static_cast<int64_t>(m.tensors.size())).field("elements", m.elems);
    j.field("bytes", m.bytes());
    for (int v = 0; v < kCudaVariants; ++v) writeResult(j, o, kCudaKeys[v], mr.r[v]);
    const Result &h = mr.r[kHoraNccl], &raw = mr.r[kNcclPerTensor], &flat = mr.r[kNcclFlat];
    j.field("hora_over_nccl_per_tensor", h.medianMs / raw.medianMs);
    j.field("hora_over_nccl_per_tensor_mean", h.meanMs / raw.meanMs);
    j.field("hora_over_nccl_flat", h.medianMs / flat.medianMs);
    j.field("us_per_tensor_above_nccl_per_tensor", usPerTensorAbove(h.medianMs, raw.medianMs, m));
    j.field("us_per_tensor_above_nccl_per_tensor_mean", usPerTensorAbove(h.meanMs, raw.meanMs, m));
    j.endObject();
  }
  j.endArray();
  j.endObject();
}

// The step on the GPU: hora on NCCL (one start, as launched) against raw NCCL on the same buffer.
int runCuda(const Options &opt, const std::vector<ModelResult> &loaded, int rank, int n) {
  const std::string plane = launchedBackend().empty() ? std::string("auto") : launchedBackend();
  std::string why;
  if (!startPlane(plane, "", &why)) failHere("--device cuda: hora could not start: " + why);
  int64_t most = 0;
  for (const ModelResult &mr : loaded) most = std::max(most, mr.model.bytes());
  std::unique_ptr<CudaSide> cuda;
  try {
    cuda = std::make_unique<CudaSide>(hora_local_rank(), static_cast<size_t>(most), 0);
  } catch (const std::exception &e) {
    failHere(std::string("--device cuda: ") + e.what());
  }
  // As a framework does: hora's work waits for what the caller queued on its own stream.
  checkHora(hora_cuda_set_stream(cuda->stream()), "hora_cuda_set_stream");
  const char *fusion = std::getenv(kFusionKnob);
  const std::vector<RankInfo> ranks = gatherRanks();
  if (rank == 0) {
    std::printf("# hora-grads --device cuda: %d ranks, float32 allreduce sum in place, %d steps "
                "after %d warm-up, check %s\n", n, opt.steps, opt.warmup,
                opt.check ? "on" : "off");
    std::printf("# launched by %s; hora as launched (HORA_CPU_BACKEND=%s, %s=%s), its CUDA "
                "tensors on NCCL\n", launcherName(), plane.c_str(), kFusionKnob,
                fusion ? fusion : "(default)");
    std::printf("# gradients: one buffer on each rank's GPU (local rank %% GPUs; rank 0: cuda:%d), "
                "each tensor a slice\n", cuda->device());
    std::printf("# hora: every tensor submitted async in reverse order on the benchmark's stream "
                "(hora_cuda_set_stream), then a wait for all\n");
    std::printf("# NCCL per tensor: an ncclAllReduce per tensor, in place, reverse order, back to "
                "back on one stream, one synchronisation; flat: one ncclAllReduce of the buffer\n");
    std::printf("# time: slowest rank per step (after a barrier); median, mean and min over "
                "steps; GB/s = gradient bytes / median\n");
    std::printf("# vs hora: median time / hora's median; above 1: hora is faster\n");
    printRanks(stdout, ranks);
    std::printf("#\n");
    std::fflush(stdout);
  }

  std::vector<CudaModelResult> results;
  int64_t wrong = 0;
  for (const ModelResult &mr : loaded) {
    CudaModelResult cr{&mr.model, {}};
    CudaStep step(mr.model, *cuda, rank, n);
    cr.r[kHoraNccl] = step.measure(opt, [&] { step.hora(); });
    cr.r[kNcclPerTensor] = step.measure(opt, [&] { step.ncclPerTensor(); });
    cr.r[kNcclFlat] = step.measure(opt, [&] { step.ncclFlat(); });
    for (const Result &r : cr.r) wrong += r.wrong;
    if (rank == 0) {  // each model says it is done as it finishes; the table needs all of them
      std::printf("# done: %s: hora %.2f ms, NCCL per tensor %.2f ms, NCCL flat %.2f ms (median "
                  "step)\n", mr.model.name.c_str(), cr.r[kHoraNccl].medianMs,
                  cr.r[kNcclPerTensor].medianMs, cr.r[kNcclFlat].medianMs);
      std::fflush(stdout);
    }
    results.push_back(cr);
  }

  int status = wrong ? 1 : 0;
  if (rank == 0) {
    Table table;
    table.addGroup("", {{"model", "", 12, true}, {"tensors", "", 7}, {"MB", "", 7}});
    table.addGroup("", {{"variant", "", 22, true}});
    table.addGroup("step time", {{"median", "(ms)", 8}, {"mean", "(ms)", 8}, {"min", "(ms)", 8}});
    table.addGroup("", {{"GB/s", "", 6}, {"vs hora", "", 7}, {"#wrong", "", 5}});
    table.printHeader(stdout);
    for (const CudaModelResult &cr : results) {
      const Model &m = *cr.model;
      for (int v = 0; v < kCudaVariants; ++v) {
        const Result &r = cr.r[v];
        table.printRow(stdout,
                       {v == 0 ? m.name : "", v == 0 ? std::to_string(m.tensors.size()) : "",
                        v == 0 ? formatFixed(m.bytes() / 1e6, 1) : "", kCudaLabels[v],
                        formatFixed(r.medianMs, 3), formatFixed(r.meanMs, 3),
                        formatFixed(r.minMs, 3), formatFixed(r.gbs, 1),
                        ratioText(r.medianMs, cr.r[kHoraNccl].medianMs),
                        opt.check ? std::to_string(r.wrong) : "N/A"});
      }
    }
    for (const CudaModelResult &cr : results) {
      const Model &m = *cr.model;
      const Result &h = cr.r[kHoraNccl], &raw = cr.r[kNcclPerTensor];
      std::printf("# %s: hora / NCCL per tensor %s (median), %s (mean); hora above NCCL per "
                  "tensor: %s us per tensor (median), %s (mean), %zu tensors; hora / NCCL flat "
                  "%s (median)\n",
                  m.name.c_str(), ratioText(h.medianMs, raw.medianMs).c_str(),
                  ratioText(h.meanMs, raw.meanMs).c_str(),
                  formatFixed(usPerTensorAbove(h.medianMs, raw.medianMs, m), 2).c_str(),
                  formatFixed(usPerTensorAbove(h.meanMs, raw.meanMs, m), 2).c_str(),
                  m.tensors.size(),
                  ratioText(h.medianMs, cr.r[kNcclFlat].medianMs).c_str());
    }
    std::printf("# Wrong values: %lld %s\n", static_cast<long long>(wrong),
                !opt.check ? "(not checked)" : wrong ? "FAILED" : "OK");
    std::fflush(stdout);
    if (!opt.json.empty() && !writeReport(opt.json, [&](FILE *f) {
          writeCudaJson(f, opt, n, fusion, plane, cuda->device(), results);
        }))
      status = 2;
  }
  broadcastBytes(&status, sizeof status);
  return status;
}

int run(int argc, char **argv) {
  const int rank = worldRank(), n = worldSize();
  Options opt;
  std::string error;
  const ParseResult parsed = parseCommandLine(argc, argv, optionSpecs(&opt), &error);
  if (parsed == ParseResult::kHelp) {
    if (rank == 0) usage(stdout);
    return 0;
  }
  const bool cudaMode = opt.device == "cuda";
  const bool defaults = opt.models.empty();
  if (defaults) {
    const std::string dir = access(HORA_GRADS_DATA_DIR "/resnet50_grads.txt", R_OK) == 0
                                ? HORA_GRADS_DATA_DIR
                                : HORA_GRADS_INSTALLED_DIR;
    opt.models = {dir + "/resnet50_grads.txt", dir + "/vit_b_16_grads.txt"};
  }
  std::vector<ModelResult> results;
  std::vector<std::string> planeNames;
  if (parsed == ParseResult::kRun) {
    if (cudaMode && !opt.planes.empty())
      error = "--planes compares CPU planes; --device cuda runs hora on NCCL";
    else if (!cudaMode)
      planeNames = opt.planes.empty() ? defaultPlanes() : parsePlanes(opt.planes, &error);
    for (const std::string &path : opt.models) {
      if (!error.empty()) break;
      std::string text;
      ModelResult mr;
      if (!readOnRoot(path, rank, &text, &error) || !parseModel(path, text, &mr.model, &error)) {
        if (defaults && !error.empty()) error += " (the default model; pass --model FILE)";
        break;
      }
      results.push_back(std::move(mr));
    }
  }
  if (error.empty() && rank == 0 && !opt.json.empty()) error = unwritable(opt.json);
  if (usageErrorAnywhere(error, rank)) return 1;
  if (cudaMode) {
    const int status = cudaUnavailable(rank, n);
    return status ? status : runCuda(opt, results, rank, n);
  }

  std::string mpiSkipped = rawMpiSkipped(&opt.mpi), glooSkipped;
  const std::vector<RankInfo> ranks = gatherRanks();
  std::unique_ptr<RawGloo> gloo;
  if (opt.gloo) gloo = RawGloo::connect(rank, ranks, &glooSkipped);
  else glooSkipped = "--gloo 0";

  // "fusion on" is hora as launched.
  const char *env = std::getenv(kFusionKnob);
  const std::string fusionEnv = env ? env : "";
  const char *launchedFusion = env ? fusionEnv.c_str() : nullptr;  // setenv may free env
  std::vector<Plane> planes;
  for (size_t p = 0; p < planeNames.size(); ++p) {
    Plane pl;
    pl.name = planeNames[p];
    const std::string &tl = launchedTimeline();
    if (!tl.empty()) {
      pl.timelineOn = p == 0 ? tl : withSuffix(tl, "-" + pl.name);
      pl.timelineOff = withSuffix(pl.timelineOn, "-fusion-off");
    }
    pl.fused.resize(results.size());
    pl.unfused.resize(results.size());
    planes.push_back(pl);
  }

  if (rank == 0) {
    std::printf("# hora-grads: %d ranks, float32 allreduce sum in place, %d steps after %d "
                "warm-up, check %s\n", n, opt.steps, opt.warmup, opt.check ? "on" : "off");
    std::string list;
    for (const std::string &p : planeNames) list += (list.empty() ? "" : ", ") + p;
    std::printf("# launched by %s; hora plane%s: %s (HORA_CPU_BACKEND; hora_init afresh for "
                "each)\n", launcherName(), planeNames.size() == 1 ? "" : "s", list.c_str());
    std::printf("# step: every tensor submitted async in reverse order (as backprop produces "
                "them), then a wait for all\n");
    std::printf("# time: slowest rank per step (after a barrier); median, mean and min over "
                "steps; GB/s = gradient bytes / median\n");
    std::printf("# fusion on: %s=%s; fusion off: hora_shutdown, %s=0, hora_init\n", kFusionKnob,
                launchedFusion ? launchedFusion : "(default)", kFusionKnob);
    std::printf("# vs hora: median time / the first plane's hora (fusion on) median; above 1: "
                "that hora is faster\n");
    if (!opt.mpi) std::printf("# raw MPI rows skipped: %s\n", mpiSkipped.c_str());
    if (gloo)
      std::printf("# Gloo rows: gloo::allreduce, blocking, tcp over %s\n", gloo->address().c_str());
    else
      std::printf("# Gloo rows skipped: %s\n", glooSkipped.c_str());
    if (launchedFusion && std::strtod(launchedFusion, nullptr) == 0)
      std::printf("# warning: %s=%s was set at launch, so 'fusion on' is not fused\n",
                  kFusionKnob, launchedFusion);
    for (const Plane &p : planes)
      if (!p.timelineOn.empty())
        std::printf("# timeline of hora on %s: fusion on in %s, fusion off in %s\n",
                    p.name.c_str(), p.timelineOn.c_str(), p.timelineOff.c_str());
    printRanks(stdout, ranks);
    std::printf("#\n");
    std::fflush(stdout);
  }

  // Each measurement says it is done as it finishes (the table below needs all of them).
  auto progress = [&](const std::string &model, const std::string &variant, const Result &r) {
    if (rank != 0 || !r.ran) return;
    std::printf("# done: %s, %s: %.2f ms median step\n", model.c_str(), variant.c_str(),
                r.medianMs);
    std::fflush(stdout);
  };
  // Per plane: latency and the fused steps with the knobs as launched (the raw rows too, in the
  // first plane that runs), then one restart without fusion for the unfused steps.
  Latency mpiLat, glooLat;
  bool rawDone = false;
  auto measureRaw = [&] {
    if (opt.latencyIters > 0) {
      float x = 1.0f;
      if (opt.mpi)
        mpiLat = latency(opt.latencyIters, [&] {
          MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        });
      if (gloo)
        glooLat = latency(opt.latencyIters, [&] {
          gloo->allreduce(&x, &x, 1, 4, reduceFunction(Kind::kF32, HORA_OP_SUM));
        });
    }
    for (ModelResult &mr : results) {
      Step step(mr.model, rank, n);
      if (opt.mpi) {
        mr.raw[kMpiPerTensor] = step.measure(opt, [&] { step.mpiPerTensor(); });
        if (mr.model.elems <= INT_MAX)
          mr.raw[kMpiFlat] = step.measure(opt, [&] { step.mpiFlat(); });
      }
      if (gloo) {
        mr.raw[kGlooPerTensor] = step.measure(opt, [&] { step.glooPerTensor(*gloo); });
        mr.raw[kGlooFlat] = step.measure(opt, [&] { step.glooFlat(*gloo); });
      }
      for (int v = 0; v < kRaws; ++v) progress(mr.model.name, kRawLabels[v], mr.raw[v]);
    }
    rawDone = true;
  };
  for (Plane &plane : planes) {
    if (!startPlane(plane.name, plane.timelineOn, &plane.skipped)) continue;
    plane.ran = true;
    if (opt.latencyIters > 0) {
      float x = 1.0f;
      int64_t one = 1;
      const Latency l = latency(opt.latencyIters, [&] {
        DLTensor t = cpuTensor(&x, DLDataType{kDLFloat, 32, 1}, &one);
        hora_request_t r = nullptr;
        checkHora(hora_allreduce_async("grads.latency", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &r),
                  "hora_allreduce_async");
        checkHora(hora_wait(r), "hora_wait");
        hora_request_free(r);
      });
      plane.latencyMedianUs = l.medianUs;
      plane.latencyMeanUs = l.meanUs;
    }
    for (size_t m = 0; m < results.size(); ++m) {
      Step step(results[m].model, rank, n);
      plane.fused[m] = step.measure(opt, [&] { step.hora(); });
      progress(results[m].model.name, "hora " + plane.name + " (fusion on)", plane.fused[m]);
    }
    if (!rawDone) measureRaw();
    // hora reads its knobs at hora_init: shut down, set the knob, start again.
    setenv(kFusionKnob, "0", 1);
    std::string why;
    const bool restarted = startPlane(plane.name, plane.timelineOff, &why);
    if (launchedFusion) setenv(kFusionKnob, fusionEnv.c_str(), 1); else unsetenv(kFusionKnob);
    if (!restarted) failHere("hora_init on " + plane.name + " without fusion (again): " + why);
    for (size_t m = 0; m < results.size(); ++m) {
      Step step(results[m].model, rank, n);
      plane.unfused[m] = step.measure(opt, [&] { step.hora(); });
      progress(results[m].model.name, "hora " + plane.name + " (fusion off)", plane.unfused[m]);
    }
  }
  if (!rawDone) {
    stopHora();  // no plane ran: the raw rows alone
    measureRaw();
  }

  int primary = -1;
  for (size_t p = 0; p < planes.size() && primary < 0; ++p)
    if (planes[p].ran) primary = static_cast<int>(p);
  int64_t wrong = 0;
  for (const ModelResult &mr : results)
    for (const Result &r : mr.raw) wrong += r.wrong;
  for (const Plane &p : planes)
    for (size_t m = 0; m < results.size(); ++m) wrong += p.fused[m].wrong + p.unfused[m].wrong;
  int status = wrong || primary < 0 ? 1 : 0;
  if (rank == 0) {
    Table table;
    table.addGroup("", {{"model", "", 12, true}, {"tensors", "", 7}, {"MB", "", 7}});
    table.addGroup("", {{"variant", "", 22, true}});
    table.addGroup("step time", {{"median", "(ms)", 8}, {"mean", "(ms)", 8}, {"min", "(ms)", 8}});
    table.addGroup("", {{"GB/s", "", 6}, {"vs hora", "", 7}, {"#wrong", "", 5}});
    table.printHeader(stdout);
    for (size_t m = 0; m < results.size(); ++m) {
      const ModelResult &mr = results[m];
      const double hora =
          primary >= 0 ? planes[static_cast<size_t>(primary)].fused[m].medianMs : std::nan("");
      bool firstRow = true;
      auto row = [&](const std::string &label, const Result &r) {
        if (!r.ran) return;
        table.printRow(stdout,
                       {firstRow ? mr.model.name : "",
                        firstRow ? std::to_string(mr.model.tensors.size()) : "",
                        firstRow ? formatFixed(mr.model.bytes() / 1e6, 1) : "", label,
                        formatFixed(r.medianMs, 2), formatFixed(r.meanMs, 2),
                        formatFixed(r.minMs, 2), formatFixed(r.gbs, 2),
                        ratioText(r.medianMs, hora),
                        opt.check ? std::to_string(r.wrong) : "N/A"});
        firstRow = false;
      };
      for (const Plane &p : planes) {
        row("hora " + p.name + " (fusion on)", p.fused[m]);
        row("hora " + p.name + " (fusion off)", p.unfused[m]);
      }
      for (int v = 0; v < kRaws; ++v) row(kRawLabels[v], mr.raw[v]);
    }
    if (opt.latencyIters > 0) {
      std::printf("# latency, one 4-byte allreduce, blocking, %d calls, median / mean (us):",
                  opt.latencyIters);
      for (const Plane &p : planes)
        if (p.ran)
          std::printf(" hora %s %.1f / %.1f;", p.name.c_str(), p.latencyMedianUs, p.latencyMeanUs);
      if (opt.mpi) std::printf(" MPI %.1f / %.1f;", mpiLat.medianUs, mpiLat.meanUs);
      if (gloo) std::printf(" Gloo %.1f / %.1f;", glooLat.medianUs, glooLat.meanUs);
      std::printf("\n");
    }
    for (const Plane &p : planes)
      if (!p.ran) std::printf("# hora on %s: skipped: %s\n", p.name.c_str(), p.skipped.c_str());
    if (primary < 0) std::printf("# no hora plane could start\n");
    std::printf("# Wrong values: %lld %s\n", static_cast<long long>(wrong),
                !opt.check ? "(not checked)" : wrong ? "FAILED" : "OK");
    std::fflush(stdout);
    if (!opt.json.empty() && !writeReport(opt.json, [&](FILE *f) {
          writeJson(f, opt, n, launchedFusion, planes, primary, mpiLat, glooLat, mpiSkipped,
                    glooSkipped, results);
        }))
      status = 2;
  }
  broadcastBytes(&status, sizeof status);
  gloo.reset();
  return status;
}

}  // namespace
}  // namespace hora::bench

int main(int argc, char **argv) {
  return hora::bench::runBenchmark(argc, argv, "hora-grads", hora::bench::run);
}
