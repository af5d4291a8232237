// SPDX-License-Identifier: Apache-2.0
// The job token's primitives on OpenSSL's libcrypto.
#include "bootstrap/env/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "base/error.h"

namespace hora {

std::string randomBytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char *>(&out[0]), static_cast<int>(n)) != 1) {
    HORA_THROW(HORA_ERR_INTERNAL, "RAND_bytes failed: no randomness for the job token's nonces");
  }
  return out;
}

std::string hexOf(const std::string &bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string proveToken(const std::string &token, const std::string &label,
                       std::initializer_list<const std::string *> parts) {
  // Each part is length-prefixed so that two different splits of the same bytes differ.
  std::string message = label;
  message.push_back('\0');
  for (const std::string *p : parts) {
    const uint64_t n = p->size();
    for (int i = 0; i < 8; ++i) message.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    message += *p;
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char *>(message.data()), message.size(), out,
           &length) == nullptr ||
      length != kProofBytes) {
    HORA_THROW(HORA_ERR_INTERNAL, "HMAC-SHA256 failed in OpenSSL");
  }
  return std::string(reinterpret_cast<const char *>(out), length);
}

bool proofsEqual(const std::string &a, const std::string &b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool LogLimiter::allow(uint64_t *suppressed) {
  const auto now = std::chrono::steady_clock::now();
  if (logged_ && now - last_ < interval_) {
    ++suppressed_;
    return false;
  }
  logged_ = true;
  last_ = now;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace hora
