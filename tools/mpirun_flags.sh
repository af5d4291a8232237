# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by the tools/ scripts: the one place that says how they launch hora programs with
# Open MPI. Sets the arrays HORA_MPIRUN_ARGS (the example, any number of ranks) and
# HORA_MPIRUN_BENCH_ARGS (the 2-rank benchmarks); HORA_MPIRUN_FLAGS in the environment replaces
# both.
# shellcheck disable=SC2034  # used by the scripts that source this file
#
# --allow-run-as-root     containers and CI run as root, which Open MPI refuses by default.
# --oversubscribe         the example runs 4 ranks on a 2-core machine.
# --bind-to none          the example runs more ranks than cores, which binding refuses.
# --bind-to core          (benchmarks, when there is a core per rank) Open MPI's own default at
#                         2 ranks, so what a plain `mpirun -np 2` gets: each rank's threads stay
#                         on its core. Unbound, the scheduler sometimes puts both ranks' busy
#                         threads on one core, and for the whole run small ops are 3-10x slower
#                         (4 KiB allreduce here: 2 us per op bound, 2-20 us unbound).
# pml ob1, btl self,vader one host, shared memory only: no probing of (and warnings about) UCX,
#                         openib or ofi devices that a container does not have. The same
#                         transports as test/multiprocess uses.
# Unlike the tests, these flags keep vader's single-copy CMA (process_vm_readv): it works on this
# machine class and large messages need it (64 MiB allreduce: about 25% slower without). Where
# ptrace is locked down (Yama ptrace_scope >= 2), Open MPI prints "Read -1, expected ..." errors
# instead, so there the copy goes through the shared segment.
HORA_MPIRUN_ARGS=(--allow-run-as-root --oversubscribe --bind-to none
                  --mca pml ob1 --mca btl 'self,vader')
if [ "$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 0)" -ge 2 ]; then
  HORA_MPIRUN_ARGS+=(--mca btl_vader_single_copy_mechanism none)
fi
HORA_MPIRUN_BENCH_ARGS=("${HORA_MPIRUN_ARGS[@]}")
if [ "$(nproc)" -ge 2 ]; then
  HORA_MPIRUN_BENCH_ARGS=("${HORA_MPIRUN_BENCH_ARGS[@]/#none/core}")
fi
if [ -n "${HORA_MPIRUN_FLAGS:-}" ]; then
  read -r -a HORA_MPIRUN_ARGS <<< "$HORA_MPIRUN_FLAGS"
  HORA_MPIRUN_BENCH_ARGS=("${HORA_MPIRUN_ARGS[@]}")
fi
