// SPDX-License-Identifier: Apache-2.0
// The one exception type inside hora, its status, and the throw/check macros.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include <hora/hora.h>

namespace hora {

// What a failure damages, derived from its status (see hora.h): the caller can tell from it
// whether the next op can still work.
enum class BlastRadius { kNone, kThisOp, kRuntime, kShutDown };
BlastRadius blastRadius(hora_status_t status);
const char *statusString(hora_status_t status);

// An outcome carried as data: what a request completes with, fanned out by the engine.
struct Status {
  hora_status_t code = HORA_SUCCESS;
  std::string message;

  bool ok() const { return code == HORA_SUCCESS; }
  static Status success() { return {}; }
};

// Thrown inside the library and converted to a status code only at the C boundary (lib/api).
// what() is "[file:line] message"; message() is the text users see.
class Error : public std::runtime_error {
 public:
  Error(hora_status_t status, std::string message, const char *file, int line);

  hora_status_t status() const { return status_; }
  const std::string &message() const { return message_; }
  Status toStatus() const { return {status_, message_}; }

 private:
  hora_status_t status_;
  std::string message_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args &...args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace hora

// HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "allreduce '", name, "': ndim ", ndim, " < 0");
#define HORA_THROW(status, ...) \
  throw ::hora::Error((status), ::hora::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Invariants of hora itself (not caller errors): a broken one is HORA_ERR_INTERNAL.
#define HORA_ENFORCE(cond, ...)                                                   \
  do {                                                                            \
    if (!(cond))                                                                  \
      HORA_THROW(HORA_ERR_INTERNAL, "internal check failed: " #cond ": ",         \
                 ::hora::detail::concat(__VA_ARGS__));                            \
  } while (0)
