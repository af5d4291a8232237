#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# libhora.so must export exactly the hora_* functions of hora.h: nothing internal leaks out.
set -euo pipefail

lib=${1:?usage: check_exports.sh path/to/libhora.so}
nm_tool=${NM:-nm}

# Every function declared in include/hora/hora.h.
expected=(
  hora_init hora_shutdown hora_is_initialized
  hora_rank hora_size hora_local_rank hora_local_size hora_cross_rank hora_cross_size
  hora_allreduce_async hora_grouped_allreduce_async hora_broadcast_async hora_allgather_async
  hora_alltoall_async hora_reducescatter_async hora_barrier hora_join
  hora_poll hora_wait hora_request_output hora_request_received_splits hora_request_free
  hora_process_set_create hora_process_set_destroy hora_process_set_rank hora_process_set_size
  hora_cuda_set_stream hora_cuda_wait hora_timeline_start hora_timeline_stop hora_status_string hora_last_error
  hora_reject hora_set_join_mode
)

# Defined dynamic symbols; 'A' entries are version-node names, not code or data.
symbols=$("$nm_tool" -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' | sort -u)

status=0
leaked=$(grep -v '^hora_' <<<"$symbols" || true)
if [[ -n "$leaked" ]]; then
  echo "non-hora symbols exported by $lib:" >&2
  sed 's/^/  /' <<<"$leaked" >&2
  status=1
fi
for f in "${expected[@]}"; do
  if ! grep -qx "$f" <<<"$symbols"; then
    echo "missing export: $f" >&2
    status=1
  fi
done
if [[ $status -eq 0 ]]; then
  echo "check_exports: $(wc -l <<<"$symbols") symbols, all hora_*, all ${#expected[@]} API functions present"
fi
exit $status
