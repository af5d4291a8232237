// SPDX-License-Identifier: Apache-2.0
// The job token's primitives: fresh nonces, HMAC-SHA256 proofs, constant-time comparison.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace hora {

// Bytes of a nonce and of an HMAC-SHA256 proof.
constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;

// `n` bytes from OpenSSL's CSPRNG (RAND_bytes); Error(HORA_ERR_INTERNAL) if it has no entropy.
std::string randomBytes(size_t n);
// Lower-case hex of `bytes`.
std::string hexOf(const std::string &bytes);
// HMAC-SHA256(token, label || 0 || parts...) over the parts' bytes; `label` keeps proofs made for
// one purpose (a client to the store, a rank to a pair) from being replayed as another's.
std::string proveToken(const std::string &token, const std::string &label,
                       std::initializer_list<const std::string *> parts);
// Constant-time equality of two proofs (CRYPTO_memcmp); false when the sizes differ.
bool proofsEqual(const std::string &a, const std::string &b);

// At most one line per `interval`: allow() says whether to log now and, through *suppressed,
// how many calls it refused since the last line. Not thread-safe (one owner thread).
class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds interval) : interval_(interval) {}
  bool allow(uint64_t *suppressed);

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_ = false;
  uint64_t suppressed_ = 0;
};

}  // namespace hora
