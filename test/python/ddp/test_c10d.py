# SPDX-License-Identifier: Apache-2.0
"""Every collective of the "hora" backend, every ReduceOp, bfloat16, subgroups, asynchronous
work and futures (c10d_worker.py), and its error paths (errors_worker.py)."""

import pytest

from conftest import launches, run


@pytest.mark.parametrize("launcher,np_", launches([1, 2, 3]))
def test_collectives(launcher, np_):
    out = run(np_, "c10d_worker.py", launcher=launcher)
    for rank in range(np_):
        assert "rank %d of %d: all collectives agree" % (rank, np_) in out, out


@pytest.mark.parametrize("launcher,np_", launches([1, 2, 3]))
def test_errors(launcher, np_):
    out = run(np_, "errors_worker.py", launcher=launcher)
    for rank in range(np_):
        assert "rank %d of %d: every error named its op" % (rank, np_) in out, out
