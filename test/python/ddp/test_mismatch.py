# SPDX-License-Identifier: Apache-2.0
"""Ranks that disagree under the "hora" backend with a 3 s process-group timeout and no
TORCH_DISTRIBUTED_DEBUG (mismatch_worker.py): other shapes or dtypes raise hora's MismatchError
on every rank at once; a collective one rank never calls raises a timeout naming it within the
timeout, later ops on that group fail at once, and every rank exits. Each rank checks its own
time limits; the launch's watchdog kills the job on a hang."""

import pytest

from conftest import launches, run


@pytest.mark.parametrize("launcher,np_", launches([2, 3], mpirun_sizes=()))
def test_shape_and_dtype_mismatch(launcher, np_):
    out = run(np_, "mismatch_worker.py", ["mismatch"], launcher=launcher, timeout=60)
    for rank in range(np_):
        assert "rank %d of %d: mismatch ok" % (rank, np_) in out, out


@pytest.mark.parametrize("launcher,np_", launches([2], mpirun_sizes=()))
def test_skipped_collective(launcher, np_):
    out = run(np_, "mismatch_worker.py", ["skip"], launcher=launcher, timeout=60)
    for rank in range(np_):
        assert "rank %d of %d: skip ok" % (rank, np_) in out, out


# horarun only: the abort on MPI's plane is faults_abort's (test/faults/abort), and under mpirun
# the ranks then skip MPI_Finalize, which mpirun reports with a non-zero status.
@pytest.mark.parametrize("launcher,np_", launches([2], mpirun_sizes=()))
def test_late_rank_after_timeout(launcher, np_):
    out = run(np_, "mismatch_worker.py", ["late"], launcher=launcher, timeout=60)
    for rank in range(np_):
        assert "rank %d of %d: late ok" % (rank, np_) in out, out
