// SPDX-License-Identifier: Apache-2.0
// hora-kernel-bench: throughput of the CPU element kernels (core/kernels.h) on each instruction
// set this CPU runs, for a cache-resident and a memory-sized buffer.
//
//   build/bench/hora-kernel-bench                 # 256 KiB and 8 MiB, every kernel
//   build/bench/hora-kernel-bench -s 1M -t 0.5    # one size, longer samples
//
// GB/s counts the tensor's own bytes, count * sizeof(dtype), per second: for widen, narrow and
// reduce-widened that is the 16-bit side, and reduce reads dst and src and writes dst (3x the
// bytes in memory traffic). Each figure is the best of several samples of repeated calls on the
// same buffers. Not a test: it checks nothing.

#include "core/kernels.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using hora::DType;
using hora::ReduceOp;
using hora::kernels_detail::Isa;

struct Options {
  std::vector<int64_t> sizes = {256 << 10, 8 << 20};
  double sampleSeconds = 0.05;
  int samples = 5;
  int offset = 0;
  std::string filter;  // only rows whose "kernel dtype" contains it
};

int64_t parseSize(const char *text) {
  char *end = nullptr;
  const double v = std::strtod(text, &end);
  int64_t scale = 1;
  if (end && (*end == 'k' || *end == 'K')) scale = 1 << 10;
  if (end && (*end == 'm' || *end == 'M')) scale = 1 << 20;
  if (end && (*end == 'g' || *end == 'G')) scale = int64_t{1} << 30;
  return static_cast<int64_t>(v * static_cast<double>(scale));
}

void usage(const char *argv0) {
  std::fprintf(stderr,
               "usage: %s [-s SIZE]... [-t SECONDS_PER_SAMPLE] [-n SAMPLES] [-o OFFSET] [-f TEXT]\n"
               "  SIZE: buffer size of the tensor in its dtype, e.g. 256K, 8M (repeatable;\n"
               "        default 256K and 8M)\n"
               "  OFFSET: bytes every buffer starts past a 64-byte boundary (default 0; 0-63,\n"
               "          a multiple of 8 keeps every dtype aligned to its size)\n"
               "  TEXT: only the rows whose \"kernel dtype\" contains it, e.g. \"sum bfloat16\"\n",
               argv0);
}

bool parse(int argc, char **argv, Options &o) {
  bool sizesGiven = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      usage(argv[0]);
      return false;
    }
    if (a == "-s") {
      if (!sizesGiven) o.sizes.clear();
      sizesGiven = true;
      o.sizes.push_back(parseSize(argv[++i]));
    } else if (a == "-t") {
      o.sampleSeconds = std::atof(argv[++i]);
    } else if (a == "-f") {
      o.filter = argv[++i];
    } else if (a == "-o") {
      o.offset = std::atoi(argv[++i]);
      if (o.offset < 0 || o.offset > 63) {
        usage(argv[0]);
        return false;
      }
    } else if (a == "-n") {
      o.samples = std::max(1, std::atoi(argv[++i]));
    } else {
      usage(argv[0]);
      return false;
    }
  }
  for (const int64_t s : o.sizes) {
    if (s < 64) {
      std::fprintf(stderr, "size %" PRId64 " too small\n", s);
      return false;
    }
  }
  return true;
}

// Buffers for one size, 64-byte aligned plus the -o offset, filled with values that stay ordinary
// under repeated calls: no NaN, no subnormals (scaling alternates x2 and x0.5, sums only grow).
struct Buffers {
  unsigned char *a, *b;
  float *wide;

  Buffers(int64_t bytes, int offset) {
    const auto n = static_cast<size_t>(bytes);
    a = carve(2 * n, offset);  // room for float32 when the tensor is 16-bit
    b = carve(n, offset);
    wide = reinterpret_cast<float *>(carve(2 * n, offset));
  }

 private:
  std::vector<std::vector<unsigned char>> storage_;

  unsigned char *carve(size_t bytes, int offset) {
    storage_.emplace_back(bytes + 128);
    auto *p = storage_.back().data();
    p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    return p + offset;
  }
};

template <typename T>
void fillTyped(void *p, int64_t count, std::mt19937 &rng) {
  auto *t = static_cast<T *>(p);
  std::uniform_real_distribution<float> dist(0.5f, 2.0f);
  for (int64_t i = 0; i < count; ++i) t[i] = static_cast<T>(dist(rng));
}

void fill(void *p, int64_t count, DType dtype, std::mt19937 &rng) {
  std::uniform_real_distribution<float> dist(0.5f, 2.0f);
  switch (dtype) {
    case DType::kUInt8:
    case DType::kBool: return fillTyped<uint8_t>(p, count, rng);
    case DType::kInt16: return fillTyped<int16_t>(p, count, rng);
    case DType::kInt8: return fillTyped<int8_t>(p, count, rng);
    case DType::kInt32: return fillTyped<int32_t>(p, count, rng);
    case DType::kInt64: return fillTyped<int64_t>(p, count, rng);
    case DType::kFloat32: return fillTyped<float>(p, count, rng);
    case DType::kFloat64: return fillTyped<double>(p, count, rng);
    case DType::kFloat16:
    case DType::kBFloat16: {
      auto *h = static_cast<uint16_t *>(p);
      for (int64_t i = 0; i < count; ++i) {
        const float v = dist(rng);
        h[i] = dtype == DType::kFloat16 ? hora::floatToHalf(v) : hora::floatToBfloat16(v);
      }
      return;
    }
  }
}

// Seconds per call: the best of `samples` samples, each as many calls as fill sampleSeconds.
double timePerCall(const std::function<void(int64_t)> &call, const Options &o) {
  using Clock = std::chrono::steady_clock;
  call(0);  // warm: pages, caches, the dispatch table
  int64_t reps = 1;
  for (;;) {  // calibrate
    const auto t0 = Clock::now();
    for (int64_t r = 0; r < reps; ++r) call(r);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s >= o.sampleSeconds / 4 || reps >= (int64_t{1} << 30)) {
      reps = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(reps) * o.sampleSeconds / std::max(s, 1e-9)));
      break;
    }
    reps *= 4;
  }
  double best = 1e30;
  for (int k = 0; k < o.samples; ++k) {
    const auto t0 = Clock::now();
    for (int64_t r = 0; r < reps; ++r) call(r);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s / static_cast<double>(reps));
  }
  return best;
}

struct Case {
  std::string kernel;
  DType dtype;
  // Runs the kernel once on `count` elements; `rep` lets a case alternate its arguments.
  std::function<void(Buffers &, int64_t count, int64_t rep)> run;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const DType floats[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  const DType sixteen[] = {DType::kFloat16, DType::kBFloat16};
  const DType all[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                       DType::kInt32,   DType::kInt64,    DType::kInt8,    DType::kUInt8};
  for (const DType t : floats) {
    out.push_back({"scale", t, [t](Buffers &b, int64_t n, int64_t rep) {
                     hora::scaleInPlace(b.a, n, t, (rep & 1) ? 0.5 : 2.0);
                   }});
  }
  for (const DType t : sixteen) {
    out.push_back({"widen", t, [t](Buffers &b, int64_t n, int64_t) {
                     hora::widenToFloat(b.b, b.wide, n, t, 0.5);
                   }});
  }
  for (const DType t : sixteen) {
    out.push_back({"narrow", t, [t](Buffers &b, int64_t n, int64_t) {
                     hora::narrowFromFloat(b.wide, b.a, n, t, 0.5);
                   }});
  }
  for (const DType t : all) {
    out.push_back({"reduce-sum", t, [t](Buffers &b, int64_t n, int64_t) {
                     hora::reduceInto(b.a, b.b, n, t, ReduceOp::kSum);
                   }});
  }
  for (const DType t : floats) {
    out.push_back({"reduce-max", t, [t](Buffers &b, int64_t n, int64_t) {
                     hora::reduceInto(b.a, b.b, n, t, ReduceOp::kMax);
                   }});
  }
  for (const DType t : floats) {
    out.push_back({"reduce-scaled-sum", t, [t](Buffers &b, int64_t n, int64_t) {
                     hora::reduceScaledInto(b.a, b.b, n, t, ReduceOp::kSum, 0.5);
                   }});
  }
  for (const DType t : sixteen) {
    out.push_back({"reduce-widened-sum", t, [t](Buffers &b, int64_t n, int64_t) {
                     hora::reduceWidenedInto(b.wide, b.b, n, t, ReduceOp::kSum, 1.0);
                   }});
    out.push_back({"reduce-widened-sum x0.5", t, [t](Buffers &b, int64_t n, int64_t) {
                     hora::reduceWidenedInto(b.wide, b.b, n, t, ReduceOp::kSum, 0.5);
                   }});
  }
  return out;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;

  std::vector<Isa> isas;
  for (int i = 0; i < hora::kernels_detail::kNumIsas; ++i) {
    const auto isa = static_cast<Isa>(i);
    if (hora::kernels_detail::isaSupported(isa)) isas.push_back(isa);
  }
  const Isa best = hora::kernels_detail::bestIsa();
  std::printf(
      "# hora kernel throughput, GB/s of tensor bytes (count * sizeof(dtype)) per second\n");
  std::printf("# instruction sets here:");
  for (const Isa isa : isas) std::printf(" %s", hora::kernels_detail::isaName(isa));
  std::printf("; default: %s\n", hora::kernels_detail::isaName(best));

  std::mt19937 rng(12345);
  for (const int64_t bytes : o.sizes) {
    Buffers bufs(bytes, o.offset);
    std::printf("\n# buffer %" PRId64 " KiB, offset %d\n", bytes >> 10, o.offset);
    std::printf("%-26s %-9s", "kernel", "dtype");
    for (const Isa isa : isas) std::printf(" %9s", hora::kernels_detail::isaName(isa));
    std::printf(" %9s\n", "speedup");
    for (const Case &c : cases()) {
      if ((c.kernel + " " + hora::dtypeName(c.dtype)).find(o.filter) == std::string::npos) continue;
      const int64_t count = bytes / static_cast<int64_t>(hora::dtypeSize(c.dtype));
      std::printf("%-26s %-9s", c.kernel.c_str(), hora::dtypeName(c.dtype));
      double scalar = 0, fastest = 0;
      for (const Isa isa : isas) {
        hora::kernels_detail::setIsaForTesting(isa);
        fill(bufs.a, count, c.dtype, rng);
        fill(bufs.b, count, c.dtype, rng);
        for (int64_t i = 0; i < std::min(count, bytes / 2); ++i)  // wide holds bytes/2 floats
          bufs.wide[i] = 1.0f + static_cast<float>(i % 7) / 8.0f;
        const double s = timePerCall([&](int64_t rep) { c.run(bufs, count, rep); }, o);
        const double gbs = static_cast<double>(bytes) / s / 1e9;
        if (isa == Isa::kScalar) scalar = gbs;
        if (isa == best) fastest = gbs;
        std::printf(" %9.2f", gbs);
        std::fflush(stdout);
      }
      std::printf(" %8.1fx\n", scalar > 0 ? fastest / scalar : 0.0);
    }
  }
  hora::kernels_detail::setIsaForTesting(best);
  return 0;
}
