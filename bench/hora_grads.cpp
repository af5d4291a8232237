// SPDX-License-Identifier: Apache-2.0
// hora-grads: one data-parallel gradient step of a real model's tensors, hora against raw MPI.

#include "bench_util.h"

#include <hora/hora.h>

#include <mpi.h>

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
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef HORA_GRADS_DATA_DIR
#define HORA_GRADS_DATA_DIR "../shared/data"
#endif

namespace hora::bench {
namespace {

constexpr const char *kFusionKnob = "HORA_FUSION_THRESHOLD";
constexpr const char *kTimelineKnob = "HORA_TIMELINE";

struct Options {
  std::vector<std::string> models;
  int steps = 20;
  int warmup = 3;
  int latencyIters = 200;
  bool check = true;
  std::string json;
};

void usage(FILE *f) {
  std::fprintf(
      f,
      "usage: mpirun -np N hora-grads [--model FILE]... [--steps N] [--warmup N] [--latency N]\n"
      "         [-c 0|1] [--json FILE]\n"
      "\n"
      "  --model FILE  a model's gradient tensors: one '#' comment line, then one 'name dims'\n"
      "                line per tensor, dims joined by 'x' (float32). Repeatable. Default:\n"
      "                resnet50_grads.txt and vit_b_16_grads.txt in\n"
      "                " HORA_GRADS_DATA_DIR "\n"
      "  --steps N     timed steps per variant (default 20)\n"
      "  --warmup N    untimed steps before them (default 3)\n"
      "  --latency N   4-byte allreduces for the latency line (default 200; 0 skips it)\n"
      "  -c, --check   verify the last step of every variant (default 1)\n"
      "  --json FILE   every figure as JSON (written by rank 0)\n"
      "\n"
      "One step, as data-parallel training runs it: every tensor of the model allreduced (sum, in\n"
      "place, on one contiguous gradient buffer), submitted in REVERSE order (as backpropagation\n"
      "produces them), then a wait for all. Variants:\n"
      "  hora (fusion on)   hora_allreduce_async per tensor with the knobs as launched (defaults\n"
      "                     unless HORA_* variables say otherwise), then hora_wait on each\n"
      "  hora (fusion off)  the same after hora_shutdown, HORA_FUSION_THRESHOLD=0, hora_init\n"
      "                     (with HORA_TIMELINE=t.json set, it traces into t-fusion-off.json)\n"
      "  MPI per tensor     a blocking MPI_Allreduce(MPI_IN_PLACE) per tensor, reverse order\n"
      "  MPI flat           one MPI_Allreduce of the whole gradient buffer\n"
      "Step time: an MPI_Barrier, the step, then the slowest rank's elapsed time; the table gives\n"
      "the median and the minimum over the steps. GB/s = gradient bytes / median step time.\n"
      "vs hora = the variant's median / hora (fusion on)'s: above 1, hora is faster.\n"
      "Latency: a blocking 4-byte allreduce (hora: submit + wait), the median over N calls,\n"
      "slowest rank, against MPI_Allreduce.\n");
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
  int ok = 1;
  if (rank == 0) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      ok = 0;
      *error = "cannot read " + path + ": " + std::strerror(errno);
    } else {
      std::ostringstream s;
      s << in.rdbuf();
      *text = s.str();
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!ok) return false;
  int64_t size = static_cast<int64_t>(text->size());
  MPI_Bcast(&size, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  text->resize(static_cast<size_t>(size));
  for (int64_t at = 0; at < size; at += INT_MAX / 2) {
    const int chunk = static_cast<int>(std::min<int64_t>(INT_MAX / 2, size - at));
    MPI_Bcast(&(*text)[static_cast<size_t>(at)], chunk, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
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
  double medianMs = std::nan(""), minMs = std::nan(""), gbs = std::nan("");
  int64_t wrong = 0;  // summed over ranks
};

enum Variant { kHoraFused, kHoraUnfused, kMpiPerTensor, kMpiFlat, kVariants };

const char *const kVariantLabels[kVariants] = {"hora (fusion on)", "hora (fusion off)",
                                               "MPI per tensor", "MPI flat (1 call)"};
const char *const kVariantKeys[kVariants] = {"hora_fusion_on", "hora_fusion_off",
                                             "mpi_per_tensor", "mpi_flat"};

// One model's gradient buffer (float32, one allocation; each tensor a slice of it) and the steps
// that reduce it.
class Step {
 public:
  Step(const Model &m, int rank, int n) : m_(m), grads_(static_cast<size_t>(m.bytes())) {
    for (const Tensor &t : m.tensors) {
      names_.push_back("grads." + m.name + "." + t.name);
      shapes_.push_back(t.numel);
    }
    requests_.resize(m.tensors.size());
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

  // Every tensor submitted in reverse order, in place, then each waited for.
  void hora() {
    const size_t count = m_.tensors.size();
    for (size_t i = count; i-- > 0;) {
      DLTensor t = cpuTensor(data() + m_.tensors[i].offset, DLDataType{kDLFloat, 32, 1},
                             &shapes_[i]);
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

  void mpiPerTensor() {
    for (size_t i = m_.tensors.size(); i-- > 0;)
      MPI_Allreduce(MPI_IN_PLACE, data() + m_.tensors[i].offset,
                    static_cast<int>(m_.tensors[i].numel), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }

  void mpiFlat() {
    MPI_Allreduce(MPI_IN_PLACE, data(), static_cast<int>(m_.elems), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  }

  // Warm-up steps, then timed ones. The sums grow step by step (in place); the buffer is filled
  // afresh, untimed, before the last step, whose result is then checked.
  Result measure(const Options &opt, const std::function<void()> &step) {
    Result r;
    r.ran = true;
    for (int i = 0; i < opt.warmup; ++i) step();
    for (int i = 0; i < opt.steps; ++i) {
      if (opt.check && i == opt.steps - 1) fill();
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      step();
      r.stepMs.push_back(slowestRank(MPI_Wtime() - t0) * 1e3);
    }
    if (opt.check) {
      r.wrong = countWrong();
      MPI_Allreduce(MPI_IN_PLACE, &r.wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    }
    r.medianMs = median(r.stepMs);
    r.minMs = *std::min_element(r.stepMs.begin(), r.stepMs.end());
    r.gbs = static_cast<double>(m_.bytes()) / (r.medianMs * 1e6);
    return r;
  }

 private:
  const Model &m_;
  Buffer grads_;
  std::vector<std::string> names_;
  std::vector<int64_t> shapes_;
  std::vector<hora_request_t> requests_;
  float input_[7], expected_[7];
};

// Where the fusion-off variant traces when HORA_TIMELINE is set: the launched path with
// "-fusion-off" before its extension ("t.json" -> "t-fusion-off.json"). hora starts the
// timeline afresh at hora_init, so the same path would lose the fusion-on trace.
std::string unfusedTimeline(const std::string &path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  const bool hasExtension = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  return hasExtension ? path.substr(0, dot) + "-fusion-off" + path.substr(dot) : path + "-fusion-off";
}

// hora reads its knobs at hora_init: shut down, set the knobs, start again.
void restartHora(const char *fusionThreshold, const std::string &timeline) {
  checkHora(hora_shutdown(), "hora_shutdown");
  setenv(kFusionKnob, fusionThreshold, 1);
  if (!timeline.empty()) setenv(kTimelineKnob, timeline.c_str(), 1);
  checkHora(hora_init(), "hora_init (again)");
}

// The median over iters blocking 4-byte allreduces, slowest rank, in us.
template <typename F>
double latencyUs(int iters, F &&once) {
  for (int i = 0; i < std::min(iters, 20); ++i) once();
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    const double t0 = MPI_Wtime();
    once();
    us.push_back((MPI_Wtime() - t0) * 1e6);
  }
  return slowestRank(median(us));
}

struct ModelResult {
  Model model;
  Result variants[kVariants];
};

std::string ratioText(double num, double den) {
  const double r = num / den;
  return std::isfinite(r) ? formatFixed(r, 2) : "n/a";
}

void writeJson(FILE *f, const Options &o, int n, const char *fusionEnv, double horaLatUs,
               double mpiLatUs, const std::vector<ModelResult> &results) {
  JsonWriter j(f);
  j.beginObject();
  j.field("ranks", n).field("steps", o.steps).field("warmup", o.warmup);
  j.field("dtype", "float32").field("op", "sum").field("check", o.check);
  if (fusionEnv) j.field("fusion_threshold_env", fusionEnv); else j.key("fusion_threshold_env").null();
  j.key("latency").beginObject().field("iters", o.latencyIters).field("hora_us", horaLatUs);
  j.field("mpi_us", mpiLatUs).field("hora_over_mpi", horaLatUs / mpiLatUs).endObject();
  j.key("models").beginArray();
  for (const ModelResult &mr : results) {
    const Model &m = mr.model;
    j.beginObject().field("name", m.name).field("file", m.file);
    j.field("tensors", static_cast<int64_t>(m.tensors.size())).field("elements", m.elems);
    j.field("bytes", m.bytes());
    for (int v = 0; v < kVariants; ++v) {
      const Result &r = mr.variants[v];
      j.key(kVariantKeys[v]);
      if (!r.ran) {
        j.null();
        continue;
      }
      j.beginObject().field("median_ms", r.medianMs).field("min_ms", r.minMs);
      j.field("gbs", r.gbs);
      if (o.check) j.field("wrong", r.wrong); else j.key("wrong").null();
      j.key("steps_ms").beginArray();
      for (double ms : r.stepMs) j.value(ms);
      j.endArray().endObject();
    }
    const double hora = mr.variants[kHoraFused].medianMs;
    j.field("mpi_per_tensor_over_hora", mr.variants[kMpiPerTensor].medianMs / hora);
    j.field("mpi_flat_over_hora", mr.variants[kMpiFlat].medianMs / hora);
    j.field("fusion_off_over_on", mr.variants[kHoraUnfused].medianMs / hora);
    j.endObject();
  }
  j.endArray();
  j.endObject();
}

int run(int argc, char **argv, int rank, int n) {
  Options opt;
  std::string error;
  const ParseResult parsed = parseCommandLine(argc, argv, optionSpecs(&opt), &error);
  if (parsed == ParseResult::kHelp) {
    if (rank == 0) usage(stdout);
    return 0;
  }
  const bool defaults = opt.models.empty();
  if (defaults)
    opt.models = {HORA_GRADS_DATA_DIR "/resnet50_grads.txt",
                  HORA_GRADS_DATA_DIR "/vit_b_16_grads.txt"};
  std::vector<ModelResult> results;
  if (parsed == ParseResult::kRun) {
    for (const std::string &path : opt.models) {
      std::string text;
      ModelResult mr;
      if (!readOnRoot(path, rank, &text, &error) || !parseModel(path, text, &mr.model, &error)) {
        if (defaults) error += " (the default model; pass --model FILE)";
        break;
      }
      results.push_back(std::move(mr));
    }
  }
  if (error.empty() && rank == 0 && !opt.json.empty()) error = unwritable(opt.json);
  if (usageErrorAnywhere(error, rank)) return 1;

  // "fusion on" is hora as launched.
  const char *env = std::getenv(kFusionKnob);
  const std::string fusionEnv = env ? env : "";
  const char *launchedFusion = env ? fusionEnv.c_str() : nullptr;  // setenv may free env
  const char *timelineEnv = std::getenv(kTimelineKnob);
  const std::string timelineOn = timelineEnv ? timelineEnv : "";
  const std::string timelineOff = timelineOn.empty() ? std::string() : unfusedTimeline(timelineOn);
  checkHora(hora_init(), "hora_init");
  if (hora_size() != n) failHere("hora sees " + std::to_string(hora_size()) + " ranks, MPI " +
                                 std::to_string(n));
  const std::vector<RankInfo> ranks = gatherRanks();

  if (rank == 0) {
    std::printf("# hora-grads: %d ranks, float32 allreduce sum in place, %d steps after %d "
                "warm-up, check %s\n", n, opt.steps, opt.warmup, opt.check ? "on" : "off");
    std::printf("# step: every tensor submitted async in reverse order (as backprop produces "
                "them), then a wait for all\n");
    std::printf("# time: slowest rank per step (after a barrier); median and min over steps; "
                "GB/s = gradient bytes / median\n");
    std::printf("# fusion on: %s=%s; fusion off: hora_shutdown, %s=0, hora_init\n", kFusionKnob,
                launchedFusion ? launchedFusion : "(default)", kFusionKnob);
    std::printf("# vs hora: median time / hora (fusion on)'s median; above 1: hora is faster\n");
    if (launchedFusion && std::strtod(launchedFusion, nullptr) == 0)
      std::printf("# warning: %s=%s was set at launch, so 'fusion on' is not fused\n",
                  kFusionKnob, launchedFusion);
    if (!timelineOff.empty())
      std::printf("# timeline: fusion on in %s=%s, fusion off in %s\n", kTimelineKnob,
                  timelineOn.c_str(), timelineOff.c_str());
    printRanks(stdout, ranks);
    std::printf("#\n");
    std::fflush(stdout);
  }

  // Latency first, while hora runs as launched.
  double horaLatUs = std::nan(""), mpiLatUs = std::nan("");
  if (opt.latencyIters > 0) {
    float x = 1.0f;
    int64_t one = 1;
    horaLatUs = latencyUs(opt.latencyIters, [&] {
      DLTensor t = cpuTensor(&x, DLDataType{kDLFloat, 32, 1}, &one);
      hora_request_t r = nullptr;
      checkHora(hora_allreduce_async("grads.latency", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &r),
                "hora_allreduce_async");
      checkHora(hora_wait(r), "hora_wait");
      hora_request_free(r);
    });
    mpiLatUs = latencyUs(opt.latencyIters, [&] {
      MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
  }

  // Everything that runs with the knobs as launched, then hora without fusion: one restart in
  // all rather than two per model.
  for (ModelResult &mr : results) {
    Step step(mr.model, rank, n);
    mr.variants[kHoraFused] = step.measure(opt, [&] { step.hora(); });
    mr.variants[kMpiPerTensor] = step.measure(opt, [&] { step.mpiPerTensor(); });
    if (mr.model.elems <= INT_MAX) mr.variants[kMpiFlat] = step.measure(opt, [&] { step.mpiFlat(); });
  }
  restartHora("0", timelineOff);
  for (ModelResult &mr : results) {
    Step step(mr.model, rank, n);
    mr.variants[kHoraUnfused] = step.measure(opt, [&] { step.hora(); });
  }

  int64_t wrong = 0;
  for (const ModelResult &mr : results)
    for (const Result &r : mr.variants) wrong += r.wrong;
  int status = wrong ? 1 : 0;
  if (rank == 0) {
    Table table;
    table.addGroup("", {{"model", "", 12, true}, {"tensors", "", 7}, {"MB", "", 7}});
    table.addGroup("", {{"variant", "", 17, true}});
    table.addGroup("step time", {{"median", "(ms)", 8}, {"min", "(ms)", 8}});
    table.addGroup("", {{"GB/s", "", 6}, {"vs hora", "", 7}, {"#wrong", "", 5}});
    table.printHeader(stdout);
    for (const ModelResult &mr : results) {
      const double hora = mr.variants[kHoraFused].medianMs;
      for (int v = 0; v < kVariants; ++v) {
        const Result &r = mr.variants[v];
        table.printRow(stdout,
                       {v == 0 ? mr.model.name : "",
                        v == 0 ? std::to_string(mr.model.tensors.size()) : "",
                        v == 0 ? formatFixed(mr.model.bytes() / 1e6, 1) : "", kVariantLabels[v],
                        formatFixed(r.medianMs, 2), formatFixed(r.minMs, 2),
                        formatFixed(r.gbs, 2), ratioText(r.medianMs, hora),
                        !r.ran ? "n/a" : opt.check ? std::to_string(r.wrong) : "N/A"});
      }
    }
    if (opt.latencyIters > 0)
      std::printf("# latency, one 4-byte allreduce, blocking, median of %d: hora %.1f us, MPI "
                  "%.1f us (hora/MPI %.1f)\n",
                  opt.latencyIters, horaLatUs, mpiLatUs, horaLatUs / mpiLatUs);
    std::printf("# Wrong values: %lld %s\n", static_cast<long long>(wrong),
                !opt.check ? "(not checked)" : wrong ? "FAILED" : "OK");
    std::fflush(stdout);
    if (!opt.json.empty()) {
      FILE *f = std::fopen(opt.json.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "%s: cannot write %s: %s\n", programName(), opt.json.c_str(),
                     std::strerror(errno));
        status = 2;
      } else {
        writeJson(f, opt, n, launchedFusion, horaLatUs, mpiLatUs, results);
        std::fclose(f);
      }
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  checkHora(hora_shutdown(), "hora_shutdown");
  return status;
}

}  // namespace
}  // namespace hora::bench

int main(int argc, char **argv) {
  return hora::bench::runUnderMpi(argc, argv, "hora-grads", hora::bench::run);
}
