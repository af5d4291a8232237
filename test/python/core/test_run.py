# SPDX-License-Identifier: Apache-2.0
"""hora.run: a function (a closure, a lambda) on local ranks that form one hora world; results
in rank order; a rank that raises, dies or hangs stops the others, and no process is left."""

import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402

import hora  # noqa: E402

# the ranks stopped after a failure would write flight recorder files (SIGTERM)
QUIET = {"HORA_FLIGHT_RECORDER": "off", "HORA_TIMEOUT_S": str(int(harness.scaled(30)))}


def children():
    """Processes whose parent is this one (zombies included)."""
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            found.append((int(pid), fields[0]))
    return found


@pytest.fixture(autouse=True)
def no_leftovers():
    before = children()
    yield
    assert children() == before, "hora.run left processes behind: %s" % children()


def test_results_in_rank_order():
    offset = np.arange(3.0)  # a closure over a local: fn is forked, never pickled

    def work(scale, label=None):
        hora.init()
        r, n = hora.rank(), hora.size()
        total = hora.allreduce(np.full(3, r + 1.0), op=hora.Sum)
        rows = hora.allgather(np.full((r + 1, 2), r, dtype=np.int32))
        return {"rank": r, "size": n, "total": total * scale + offset, "rows": rows,
                "label": label, "extra": os.environ.get("HORA_TEST_RUN_EXTRA")}

    results = hora.run(work, args=(2.0,), kwargs={"label": "L"}, np=3,
                       env=dict(QUIET, HORA_TEST_RUN_EXTRA="passed"), timeout=harness.scaled(60))
    assert [res["rank"] for res in results] == [0, 1, 2]
    want_rows = np.concatenate([np.full((k + 1, 2), k, dtype=np.int32) for k in range(3)])
    for res in results:
        assert res["size"] == 3 and res["label"] == "L" and res["extra"] == "passed"
        np.testing.assert_array_equal(res["total"], np.full(3, 12.0) + offset)
        np.testing.assert_array_equal(res["rows"], want_rows)
    assert not hora.is_initialized()  # the caller's hora is untouched


def test_lambda_and_horovod_names():
    assert hora.run(lambda: int(os.environ["RANK"]) * 10, num_proc=2, env=QUIET) == [0, 10]


def test_a_raising_rank_stops_the_others():
    def work():
        hora.init()
        if hora.rank() == 1:
            raise KeyError("no such row in rank 1")
        time.sleep(harness.scaled(60))  # stopped by hora.run, long before this ends
        return "slept"

    start = time.monotonic()
    with pytest.raises(hora.RunError) as info:
        hora.run(work, np=2, env=QUIET, timeout=harness.scaled(60))
    assert time.monotonic() - start < harness.scaled(20)
    e = info.value
    assert e.rank == 1 and "rank 1 of 2" in str(e) and "KeyError" in str(e)
    assert "no such row in rank 1" in e.traceback and "in work" in e.traceback
    assert isinstance(e.exception, KeyError)


def test_a_dying_rank():
    def work():
        if os.environ["RANK"] == "0":
            os._exit(3)  # no result, no traceback
        time.sleep(harness.scaled(60))

    with pytest.raises(hora.RunError) as info:
        hora.run(work, np=2, env=QUIET, timeout=harness.scaled(60))
    assert info.value.rank == 0 and info.value.exitcode == 3 and info.value.traceback is None
    assert "exited with status 3" in str(info.value)


def test_timeout():
    start = time.monotonic()
    with pytest.raises(hora.RunTimeoutError) as info:
        hora.run(lambda: time.sleep(60) if os.environ["RANK"] == "1" else "quick", np=2,
                 env=QUIET, timeout=1.5)
    assert time.monotonic() - start < harness.scaled(10)
    assert isinstance(info.value, TimeoutError) and info.value.rank == 1
    assert "rank 1" in str(info.value)


def _one_rank_hangs():
    import hora as h
    h.init()
    if h.rank() == 2:
        time.sleep(60)  # never reaches the allreduce the others wait in
    h.allreduce(np.ones(4, np.float32), name="x")
    return h.rank()


def test_timeout_names_the_rank_that_hung():
    """Ranks 0 and 1 wait in an allreduce for rank 2, which sleeps in its own code: the timeout
    names rank 2 as the one that hung, not every rank (the others are waiting in hora for it)."""
    with pytest.raises(hora.RunTimeoutError) as info:
        hora.run(_one_rank_hangs, np=3, env=QUIET, timeout=harness.scaled(4))
    text = str(info.value)
    assert info.value.rank == 2, text
    assert "rank 2 never returned and was not in a hora call" in text, text
    assert "ranks 0, 1 waited in hora for it" in text, text


def test_arguments():
    with pytest.raises(ValueError):
        hora.run(lambda: 1, np=0)
    with pytest.raises(ValueError):
        hora.run(lambda: 1, np=2, hosts="a:2,b:2")
    with pytest.raises(ValueError):
        hora.run(lambda: 1, np=2, num_proc=3)


def test_after_torch_used_threads():
    """Forked from a process whose OpenMP pool already ran, a rank with several threads would
    wait forever for threads fork did not copy: each rank runs with one, as under torchrun."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(400, 400)
        (a @ a).sum()

        def work():
            b = torch.randn(300, 300)
            return float((b @ b).sum() * 0), os.environ["OMP_NUM_THREADS"], torch.get_num_threads()

        assert hora.run(work, np=2, env=QUIET, timeout=harness.scaled(20)) == [(0.0, "1", 1)] * 2
    finally:
        torch.set_num_threads(threads)
