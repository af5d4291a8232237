// SPDX-License-Identifier: Apache-2.0
// hora.h compiled alone as pedantic C++17: C linkage and no C-only constructs.
#include <hora/hora.h>

#include <type_traits>

static_assert(std::is_same<decltype(&hora_init), hora_status_t (*)(void)>::value, "hora_init");
static_assert(std::is_same<decltype(&hora_allreduce_async),
                           hora_status_t (*)(const char *, const DLTensor *, DLTensor *,
                                             hora_reduce_op_t, double, double, int32_t,
                                             hora_request_t *)>::value,
              "hora_allreduce_async");
static_assert(HORA_ERR_INTERNAL == 10 && HORA_OP_PRODUCT == 4, "enum values");

int main() {
  // Links only if the symbols have C linkage (unmangled) in libhora.so.
  hora_status_t (*volatile init)(void) = &hora_init;
  const char *(*volatile lastError)(void) = &hora_last_error;
  return init != nullptr && lastError != nullptr && hora_rank() == -1 ? 0 : 1;
}
