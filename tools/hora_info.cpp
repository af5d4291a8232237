// SPDX-License-Identifier: Apache-2.0
// hora-info: the build configuration and every HORA_* knob with its default and current value.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/registry.h"
#include "base/error.h"
#include "base/knobs.h"
#include "core/collectives/algorithms.h"
#include "hora_config.h"
#include "hora_info_config.h"  // the Python package and the torch backend, as configured
#if HORA_HAVE_NCCL
#include "backends/nccl/nccl_device.h"  // no CUDA headers: facades
#include "backends/nccl/nccl_kernels.h"
#endif

namespace {

const char kUsage[] =
    "usage: hora-info [--knobs-markdown | --knobs-json | --version | --help]\n"
    "  (no option)       the build configuration and every HORA_* knob: default, current value\n"
    "  --knobs-markdown  the knob table of README.md (tools/update_knob_docs.sh writes it there)\n"
    "  --knobs-json      every knob as JSON [{\"name\", \"default\", \"doc\"}] (horarun --help)\n"
    "  --version         hora's version\n";

// A knob's doc without the `backticks` that mark code in Markdown.
std::string plainDoc(const char *doc) {
  std::string out;
  for (const char *c = doc; *c != '\0'; ++c) {
    if (*c != '`') out += *c;
  }
  return out;
}

std::string jsonString(const char *text) {
  std::string out = "\"";
  for (const char *c = text; *c != '\0'; ++c) {
    const unsigned char u = static_cast<unsigned char>(*c);
    if (u == '"' || u == '\\') {
      out += '\\';
      out += *c;
    } else if (u < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += *c;
    }
  }
  return out + "\"";
}

// The exact block between README.md's knobs:begin and knobs:end markers.
void printMarkdown() {
  std::printf("| knob | default | meaning |\n|---|---|---|\n");
  for (const hora::KnobSpec &k : hora::knobTable()) {
    const std::string def = k.defaultValue[0] ? "`" + std::string(k.defaultValue) + "`" : "unset";
    std::printf("| `%s` | %s | %s |\n", k.name, def.c_str(), hora::knobDoc(k).c_str());
  }
  std::printf("\nHorovod variables accepted without a hora knob (`0` or `1`; `1` logs this at "
              "`info` level):\n\n");
  for (const hora::KnobAlias &a : hora::knobAliases()) {
    if (a.knob == nullptr) std::printf("- `%s`: %s\n", a.name, a.doc);
  }
}

// Machine-readable, for horarun --help: one object per knob, in table order; docs in plain text.
void printJson() {
  std::printf("[\n");
  const auto &table = hora::knobTable();
  for (size_t i = 0; i < table.size(); ++i) {
    const hora::KnobSpec &k = table[i];
    std::printf("  {\"name\": %s, \"default\": %s, \"doc\": %s}%s\n", jsonString(k.name).c_str(),
                jsonString(k.defaultValue).c_str(),
                jsonString(plainDoc(hora::knobDoc(k).c_str()).c_str()).c_str(),
                i + 1 < table.size() ? "," : "");
  }
  std::printf("]\n");
}

// What the build made for Python, and for which versions: the wheel or prefix install, the Python
// package (its Python; CUDA tensors go through libhora's NCCL backend, built with the CUDA
// runtime named), the torch.distributed backend (its torch, that torch's CUDA, its Python).
void printPython() {
  if (!HORA_BUILT_PYTHON) {
    std::printf("  python:       hora package no (built without the Python bindings, for %s)\n",
                HORA_PYTHON_EXE);
    return;
  }
  const bool cuda = std::strcmp(HORA_CUDA_VERSION, "none") != 0;
  std::printf("  python:       hora package yes, for Python %s (%s)%s; numpy %s; %s%s\n",
              HORA_PYTHON_VERSION, HORA_PYTHON_EXE, HORA_WHEEL ? ", installed by pip" : "",
              HORA_PYTHON_NUMPY ? "yes" : "no", cuda ? "CUDA " : "no CUDA (no NCCL backend)",
              cuda ? HORA_CUDA_VERSION : "");
  if (HORA_BUILT_TORCH_BACKEND) {
    const bool torchCuda = std::strcmp(HORA_TORCH_CUDA, "none") != 0;
    std::printf("                torch.distributed backend \"hora\" yes, for torch %s (%s%s), "
                "Python %s\n", HORA_TORCH_VERSION, torchCuda ? "CUDA " : "a CPU-only torch",
                torchCuda ? HORA_TORCH_CUDA : "", HORA_PYTHON_VERSION);
  } else {
    std::printf("                torch.distributed backend \"hora\" no (needs torch 1.13 with its C++ "
                "headers; found torch %s)\n", HORA_TORCH_VERSION);
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (argc > 1) {
    const char *mode = argv[1];
    if (argc == 2 && std::strcmp(mode, "--knobs-markdown") == 0) {
      printMarkdown();
      return 0;
    }
    if (argc == 2 && std::strcmp(mode, "--knobs-json") == 0) {
      printJson();
      return 0;
    }
    if (argc == 2 && std::strcmp(mode, "--version") == 0) {
      std::printf("hora-info (hora) %s\n", HORA_VERSION);
      return 0;
    }
    const bool help =
        argc == 2 && (std::strcmp(mode, "--help") == 0 || std::strcmp(mode, "-h") == 0);
    std::fputs(kUsage, help ? stdout : stderr);
    return help ? 0 : 2;
  }
  std::printf("hora %s (%s build, %s)\n", HORA_VERSION, HORA_BUILDTYPE, HORA_COMPILER);
  std::printf("  bootstraps:   mpi %s, env:// and slurm %s, single yes\n",
              HORA_HAVE_MPI ? "yes" : "no (built without MPI)",
              HORA_HAVE_GLOO ? "yes" : "no (built without Gloo)");
  // The registry's list, in the order HORA_CPU_BACKEND=auto tries them.
  std::string planes;
  for (const hora::PlaneInfo &p : hora::cpuPlanes()) {
    planes += (planes.empty() ? "" : ", ") + p.name +
              (p.note.empty() ? "" : " (" + p.note + ")") + (p.built ? " yes" : " no");
  }
  std::printf("  cpu backends: %s\n", planes.c_str());
  for (const hora::PlaneInfo &p : hora::cpuPlanes()) {
    if (p.built && p.describe != nullptr) std::printf("                %s\n", p.describe().c_str());
  }
#if HORA_HAVE_NCCL
  const int gpus = hora::nccl_device::deviceCount();
  std::printf("  gpu backends: nccl yes; %d CUDA device%s visible%s%s\n",
              gpus, gpus == 1 ? "" : "s", gpus == 0 ? ": " : "",
              gpus == 0 ? hora::nccl_device::whyNoDevice().c_str() : "");
  std::printf("                kernels built for %s\n", hora::nccl_kernels::builtArchitectures());
  for (int d = 0; d < gpus; ++d) {
    const std::string why = hora::nccl_kernels::kernelsRunOn(d);
    std::printf("                cuda:%d %s: %s%s\n", d, hora::nccl_kernels::deviceDescription(d).c_str(),
                why.empty() ? "kernels run" : "kernels do not run: ", why.c_str());
  }
#else
  std::printf("  gpu backends: nccl no (built without CUDA/NCCL/nvcc)\n");
#endif
  printPython();
  std::printf("\n");

  hora::Knobs current;
  hora::KnobReport report;
  std::string error;
  try {
    current = hora::Knobs::fromEnvironment(&report);
  } catch (const hora::Error &e) {
    error = e.message();
  }
  // Which allreduce a CPU tensor gets, by where the set's ranks are, under these knobs.
  std::printf("allreduce of CPU tensors (HORA_SHM=%s, HORA_HIERARCHICAL=%s):\n", current.shm.c_str(),
              current.hierarchical.c_str());
  std::printf("  a set on one host:    %s\n",
              current.shm == "off" ? "the plane's own allreduce" : "shared memory");
  std::printf("  a set across hosts:   %s\n",
              current.hierarchical == "off"  ? "the plane's own allreduce, flat (one collective over every rank)"
              : current.hierarchical == "on" ? "hierarchical wherever a host holds two of its ranks: shared "
                                               "memory inside each host, the plane across"
                                             : "hierarchical wherever a host holds two of its ranks, from the "
                                               "size a model measured as the set forms gives (shared memory "
                                               "inside each host, the plane across); below, the plane's own");
  std::printf("  (HORA_LOG_LEVEL=info logs each set's choice; a timeline's operations carry \"algorithm\")\n\n");
  // The algorithm tables of the planes that are links, in the order their size rules are tried.
  std::string links;
  for (const hora::PlaneInfo &p : hora::cpuPlanes()) {
    if (p.link) links += (links.empty() ? "" : ", ") + p.name;
  }
  std::printf("algorithms of the %s planes (first whose rule holds; HORA_ALGORITHM=%s):\n",
              links.c_str(), current.algorithm.empty() ? "unset" : current.algorithm.c_str());
  for (size_t c = 0; c < hora::collectives::kNumCollectives; ++c) {
    const auto collective = static_cast<hora::collectives::Collective>(c);
    std::printf("  %s\n", hora::collectives::collectiveName(collective));
    for (const hora::collectives::Algorithm &a : hora::collectives::table(collective)) {
      std::printf("    %-20s %s\n", a.name, a.rule);
    }
  }
  std::printf("\n");
  std::printf("%-24s %-10s %-12s %s\n", "knob", "default", "current", "meaning");
  for (const hora::KnobSpec &k : hora::knobTable()) {
    std::string value = k.show(current);
    auto origin = report.origin.find(k.name);
    if (origin != report.origin.end()) {
      value += origin->second == k.name ? " (set)" : " (from " + origin->second + ")";
    }
    const std::string doc = plainDoc(hora::knobDoc(k).c_str());
    std::printf("%-24s %-10s %-12s %s\n", k.name, k.defaultValue[0] ? k.defaultValue : "unset",
                value.empty() ? "unset" : value.c_str(), doc.c_str());
  }
  std::printf("\nHorovod variables accepted without a hora knob:\n");
  for (const hora::KnobAlias &a : hora::knobAliases()) {
    if (a.knob == nullptr) std::printf("  %s: %s\n", a.name, plainDoc(a.doc).c_str());
  }
  if (!report.notes.empty()) std::printf("\n");
  for (const auto &note : report.notes) {  // what hora_init would log, whatever the log level
    std::printf("%s: %s\n", hora::logLevelName(note.first), note.second.c_str());
  }
  if (!error.empty()) {
    std::printf("\nerror: %s\n", error.c_str());
    return 1;
  }
  return 0;
}
