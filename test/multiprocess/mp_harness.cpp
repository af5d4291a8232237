// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the multi-process tests: dtype tables, conversions, tensors, checks.
#include "mp_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "time_scale.h"

namespace mp {

const std::vector<DType> &allDTypes() {
  static const std::vector<DType> kAll = {
      {"uint8", kDLUInt, 8, false, false},     {"int8", kDLInt, 8, false, true},
      {"int32", kDLInt, 32, false, true},      {"int64", kDLInt, 64, false, true},
      {"float16", kDLFloat, 16, true, true},   {"bfloat16", kDLBfloat, 16, true, true},
      {"float32", kDLFloat, 32, true, true},   {"float64", kDLFloat, 64, true, true},
  };
  return kAll;
}

const std::vector<DType> &floatDTypes() {
  static const std::vector<DType> kFloats = [] {
    std::vector<DType> v;
    for (const DType &d : allDTypes())
      if (d.floating) v.push_back(d);
    return v;
  }();
  return kFloats;
}

const DType &dtypeNamed(const std::string &name) {
  for (const DType &d : allDTypes())
    if (name == d.name) return d;
  throw std::invalid_argument("no dtype " + name);
}

const std::vector<hora_reduce_op_t> &allOps() {
  static const std::vector<hora_reduce_op_t> kOps = {HORA_OP_SUM, HORA_OP_AVERAGE, HORA_OP_MIN,
                                                     HORA_OP_MAX, HORA_OP_PRODUCT};
  return kOps;
}

const char *opName(hora_reduce_op_t op) {
  switch (op) {
    case HORA_OP_SUM: return "sum";
    case HORA_OP_AVERAGE: return "average";
    case HORA_OP_MIN: return "min";
    case HORA_OP_MAX: return "max";
    case HORA_OP_PRODUCT: return "product";
  }
  return "op?";
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Scaling by powers of two is exact,
// so rounding reduces to std::nearbyint on a scaled significand (round half to even in the
// default rounding mode).
uint16_t floatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(f)) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a == 0.0) return sign;
  int e2 = 0;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1): unbiased exponent is e2 - 1
  int exponent = e2 - 1;
  if (exponent < -14) {
    // Subnormal: units of 2^-24. Rounding up to 1024 lands exactly on the smallest normal.
    const double q = std::nearbyint(std::ldexp(a, 24));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  double q = std::nearbyint(std::ldexp(a, 10 - exponent));  // in [1024, 2048]
  if (q >= 2048.0) {
    q = 1024.0;
    ++exponent;
  }
  if (exponent > 15) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | ((exponent + 15) << 10) | (static_cast<int>(q) - 1024));
}

float halfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double v;
  if (exponent == 0)
    v = std::ldexp(static_cast<double>(mantissa), -24);
  else if (exponent == 31)
    v = mantissa ? std::nan("") : INFINITY;
  else
    v = std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  return static_cast<float>((h & 0x8000u) ? -v : v);
}

// bfloat16 is the top half of a float32: round the dropped 16 bits to nearest even.
uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);
}

float bf16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

double roundTo(const DType &dt, double v) {
  if (!dt.floating) return v;
  switch (dt.code == kDLBfloat ? 116 : dt.bits) {
    case 16: return halfToFloat(floatToHalf(static_cast<float>(v)));
    case 116: return bf16ToFloat(floatToBf16(static_cast<float>(v)));
    case 32: return static_cast<float>(v);
    default: return v;
  }
}

double ulp(const DType &dt, double v) {
  if (!dt.floating || v == 0.0) return 0.0;
  int digits = 53;  // significand bits including the implicit one
  if (dt.code == kDLBfloat)
    digits = 8;
  else if (dt.bits == 16)
    digits = 11;
  else if (dt.bits == 32)
    digits = 24;
  int e2 = 0;
  std::frexp(v, &e2);
  return std::ldexp(1.0, e2 - digits);
}

int64_t numel(const DLTensor &t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

double readElement(const DLTensor &t, int64_t i) {
  const char *base = static_cast<const char *>(t.data) + t.byte_offset;
  const size_t width = t.dtype.bits / 8;
  const char *p = base + static_cast<size_t>(i) * width;
  switch (t.dtype.code) {
    case kDLUInt: {
      uint8_t v;
      std::memcpy(&v, p, 1);
      return v;
    }
    case kDLInt:
      if (t.dtype.bits == 8) {
        int8_t v;
        std::memcpy(&v, p, 1);
        return v;
      } else if (t.dtype.bits == 32) {
        int32_t v;
        std::memcpy(&v, p, 4);
        return v;
      } else {
        int64_t v;
        std::memcpy(&v, p, 8);
        return static_cast<double>(v);
      }
    case kDLBfloat: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return bf16ToFloat(v);
    }
    case kDLFloat:
      if (t.dtype.bits == 16) {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return halfToFloat(v);
      } else if (t.dtype.bits == 32) {
        float v;
        std::memcpy(&v, p, 4);
        return v;
      } else {
        double v;
        std::memcpy(&v, p, 8);
        return v;
      }
  }
  return std::nan("");
}

HostTensor::HostTensor(const DType &dt, std::vector<int64_t> shape)
    : dt_(dt), shape_(std::move(shape)), numel_(1), dl_() {
  for (int64_t s : shape_) numel_ *= s;
  // Never empty, so even a zero-element tensor has a valid data pointer; NULL data is tested
  // on its own.
  const size_t bytes = static_cast<size_t>(numel_) * dt_.bytes();
  storage_.assign(bytes / 8 + 1, 0);
  dl_.data = storage_.data();
  dl_.device = DLDevice{kDLCPU, 0};
  dl_.ndim = static_cast<int>(shape_.size());
  dl_.dtype = dt_.dl();
  dl_.shape = shape_.data();
  dl_.strides = nullptr;
  dl_.byte_offset = 0;
}

double HostTensor::get(int64_t i) const { return readElement(dl_, i); }

void HostTensor::set(int64_t i, double v) {
  char *p = static_cast<char *>(dl_.data) + dl_.byte_offset +
            static_cast<size_t>(i) * dt_.bytes();
  switch (dt_.code) {
    case kDLUInt: {
      const uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(p, &x, 1);
      return;
    }
    case kDLInt:
      if (dt_.bits == 8) {
        const int8_t x = static_cast<int8_t>(v);
        std::memcpy(p, &x, 1);
      } else if (dt_.bits == 32) {
        const int32_t x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
      } else {
        const int64_t x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
      }
      return;
    case kDLBfloat: {
      const uint16_t x = floatToBf16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      return;
    }
    case kDLFloat:
      if (dt_.bits == 16) {
        const uint16_t x = floatToHalf(static_cast<float>(v));
        std::memcpy(p, &x, 2);
      } else if (dt_.bits == 32) {
        const float x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
      } else {
        std::memcpy(p, &v, 8);
      }
      return;
  }
}

void HostTensor::fill(const std::function<double(int64_t)> &f) {
  for (int64_t i = 0; i < numel_; ++i) set(i, f(i));
}

std::unique_ptr<HostTensor> makeTensor(const DType &dt, std::vector<int64_t> shape) {
  return std::make_unique<HostTensor>(dt, std::move(shape));
}

int rank() { return hora_rank(); }
int size() { return hora_size(); }

namespace {
int64_t posMod(int64_t a, int64_t m) { return ((a % m) + m) % m; }
}  // namespace

double inputValue(hora_reduce_op_t op, const DType &dt, int r, int n, int64_t j, int64_t salt) {
  const int64_t k = j + 7 * salt;
  switch (op) {
    case HORA_OP_PRODUCT: {
      // |x| <= 3 so the product over 4 ranks fits int8/uint8 and stays exact in bfloat16.
      static const int kSigned[4] = {-2, -1, 1, 2};
      return dt.isSigned ? kSigned[posMod(r + 2 * k, 4)] : static_cast<double>(posMod(r + k, 3) + 1);
    }
    case HORA_OP_AVERAGE: {
      // Offsets that cancel across ranks: the sum is n * base, so the exact average is base,
      // representable in every dtype.
      const double base = static_cast<double>(posMod(k, 7) - 3);
      if (r < n - 1) return base + static_cast<double>(posMod(r + k, 3));
      double others = 0;
      for (int q = 0; q < n - 1; ++q) others += static_cast<double>(posMod(q + k, 3));
      return base - others;
    }
    default: {
      const int64_t v = posMod(7 * r + 3 * k, 11);
      return dt.isSigned ? static_cast<double>(v - 5) : static_cast<double>(v);
    }
  }
}

double expectedValue(hora_reduce_op_t op, const DType &dt, int n, int64_t j, int64_t salt,
                     double prescale, double postscale) {
  // Every intermediate is a small dyadic rational, exact in double: the only rounding is the
  // final one to the dtype, as the contract asks of float16/bfloat16.
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    const double x = prescale * inputValue(op, dt, r, n, j, salt);
    if (r == 0) {
      acc = x;
      continue;
    }
    switch (op) {
      case HORA_OP_SUM:
      case HORA_OP_AVERAGE: acc += x; break;
      case HORA_OP_MIN: acc = std::min(acc, x); break;
      case HORA_OP_MAX: acc = std::max(acc, x); break;
      case HORA_OP_PRODUCT: acc *= x; break;
    }
  }
  if (op == HORA_OP_AVERAGE) acc /= n;
  return roundTo(dt, postscale * acc);
}

double tolerance(hora_reduce_op_t op, const DType &dt, double expected) {
  return op == HORA_OP_AVERAGE ? ulp(dt, expected) : 0.0;
}

namespace {
template <typename Get>
::testing::AssertionResult compareAll(int64_t n, Get get,
                                      const std::function<double(int64_t)> &expected,
                                      const std::function<double(int64_t)> &tol) {
  int64_t bad = 0;
  std::ostringstream msg;
  msg << std::setprecision(17);
  for (int64_t i = 0; i < n; ++i) {
    const double got = get(i);
    const double want = expected(i);
    const double t = tol ? tol(i) : 0.0;
    const bool ok = (got == want) || (std::isnan(got) && std::isnan(want)) ||
                    (t > 0 && std::fabs(got - want) <= t);
    if (!ok) {
      if (bad < 5) msg << "\n  [" << i << "] got " << got << ", expected " << want;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " elements wrong"
         << msg.str();
}
}  // namespace

::testing::AssertionResult matches(const HostTensor &t,
                                   const std::function<double(int64_t)> &expected,
                                   const std::function<double(int64_t)> &tol) {
  return compareAll(t.numel(), [&](int64_t i) { return t.get(i); }, expected, tol);
}

::testing::AssertionResult matches(const DLTensor &t,
                                   const std::function<double(int64_t)> &expected) {
  return compareAll(numel(t), [&](int64_t i) { return readElement(t, i); }, expected, nullptr);
}

void fillInput(HostTensor &in, hora_reduce_op_t op, int64_t salt) {
  const int r = rank(), n = size();
  in.fill([&](int64_t j) { return inputValue(op, in.dtype(), r, n, j, salt); });
}

::testing::AssertionResult matchesReduction(const HostTensor &out, hora_reduce_op_t op,
                                            int64_t salt, double prescale, double postscale) {
  const int n = size();
  const DType dt = out.dtype();
  // Expected values repeat with period 3*4*7*11 in j (and n), so compute them once per residue
  // instead of once per element of a 300000-element tensor.
  const int64_t period = 924;
  std::vector<double> table(static_cast<size_t>(std::min<int64_t>(out.numel(), period)));
  for (size_t j = 0; j < table.size(); ++j)
    table[j] = expectedValue(op, dt, n, static_cast<int64_t>(j), salt, prescale, postscale);
  return matches(
      out, [&](int64_t j) { return table[static_cast<size_t>(j % period)]; },
      [&](int64_t j) { return tolerance(op, dt, table[static_cast<size_t>(j % period)]); });
}

std::string statusName(hora_status_t s) {
  switch (s) {
    case HORA_SUCCESS: return "HORA_SUCCESS";
    case HORA_ERR_INVALID_ARGUMENT: return "HORA_ERR_INVALID_ARGUMENT";
    case HORA_ERR_NOT_INITIALIZED: return "HORA_ERR_NOT_INITIALIZED";
    case HORA_ERR_DUPLICATE_NAME: return "HORA_ERR_DUPLICATE_NAME";
    case HORA_ERR_MISMATCH: return "HORA_ERR_MISMATCH";
    case HORA_ERR_UNSUPPORTED: return "HORA_ERR_UNSUPPORTED";
    case HORA_ERR_TIMEOUT: return "HORA_ERR_TIMEOUT";
    case HORA_ERR_PEER_LOST: return "HORA_ERR_PEER_LOST";
    case HORA_ERR_BACKEND: return "HORA_ERR_BACKEND";
    case HORA_ERR_SHUT_DOWN: return "HORA_ERR_SHUT_DOWN";
    case HORA_ERR_INTERNAL: return "HORA_ERR_INTERNAL";
  }
  return "status(" + std::to_string(static_cast<int>(s)) + ")";
}

std::string lastError() {
  const char *e = hora_last_error();
  return e ? e : "(null)";
}

bool completesWithin(hora_request_t req, double seconds, std::chrono::microseconds pause) {
  const auto deadline = std::chrono::steady_clock::now() + hora_test::scaled(seconds);
  for (;;) {
    int done = 0;
    const hora_status_t s = hora_poll(req, &done);
    if (s != HORA_SUCCESS) {
      ADD_FAILURE() << "hora_poll -> " << statusName(s) << ": " << lastError();
      return true;
    }
    if (done) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (pause.count() > 0) {
      std::this_thread::sleep_for(pause);
    } else {
      std::this_thread::yield();
    }
  }
}

::testing::AssertionResult statusIs(const char *expectedExpr, const char *actualExpr,
                                    hora_status_t expected, hora_status_t actual) {
  if (expected == actual) return ::testing::AssertionSuccess();
  // Copied at once: the pointer is only valid until the next hora call on this thread.
  const std::string why = lastError();
  (void)expectedExpr;
  return ::testing::AssertionFailure()
         << actualExpr << "\n  returned " << statusName(actual)
         << ", expected " << statusName(expected) << "\n  hora_last_error: '" << why << "'";
}

}  // namespace mp
