# SPDX-License-Identifier: Apache-2.0
"""hora._launch, the C bootstrap's launch rules mirrored in Python: Slurm's variables read as
lib/bootstrap/env/launch_config.cpp reads them (the cases of test/unit/test_launch_config.cpp,
same values, same messages), torch's env:// variables filled from them, which bootstrap
hora_init() would take, and where hora's store goes beside torch's. No ranks are started."""

import sys

import pytest

from hora import _launch


def slurm(**changes):
    """The C test's Slurm step: task 5 of 8, 4 per node, on the step's second node."""
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]",
           "SLURM_JOB_NODELIST": "gpu[01-09]", "SLURM_JOB_ID": "123456"}
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


def test_full_step():
    assert _launch.slurm_config(slurm()) == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "NODE_RANK": "1",
        "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "gpu07", "MASTER_PORT": "13456"}


def test_master_and_port_precedence():
    assert _launch.slurm_config(slurm(SLURM_STEP_NODELIST=None))["MASTER_ADDR"] == "gpu01"
    env = slurm(SLURM_STEP_NODELIST=None, SLURM_JOB_NODELIST=None, SLURM_NODELIST="old-name")
    assert _launch.slurm_config(env)["MASTER_ADDR"] == "old-name"
    env = slurm(MASTER_ADDR="10.1.2.3", SLURM_STEP_NODELIST="[[broken")
    assert _launch.slurm_config(env)["MASTER_ADDR"] == "10.1.2.3"
    env = slurm(MASTER_PORT="4242", SLURM_JOB_ID="junk")  # the job id is not even read
    assert _launch.slurm_config(env)["MASTER_PORT"] == "4242"
    with pytest.raises(ValueError, match=r"^MASTER_PORT=99999 is outside 1\.\.65535$"):
        _launch.slurm_config(slurm(MASTER_PORT="99999"))
    empty = slurm(SLURM_STEP_NODELIST="")  # set but empty counts as unset
    assert _launch.slurm_config(empty)["MASTER_ADDR"] == "gpu01"


def test_port_from_job_id():
    for job, port in ((0, 10000), (19999, 29999), (20000, 10000), (123456, 13456),
                      (18446744073709551615, 10000 + 11615)):
        assert _launch.slurm_port_for_job(job) == port
    assert _launch.slurm_config(slurm(SLURM_JOB_ID="7"))["MASTER_PORT"] == "10007"


def test_local_world_size():
    def local_size(env):
        return _launch.slurm_config(env).get("LOCAL_WORLD_SIZE")
    assert local_size(slurm(SLURM_TASKS_PER_NODE="3,2(x2)")) == "2"  # this node's entry
    assert local_size(slurm(SLURM_TASKS_PER_NODE="3,2(x2)", SLURM_NODEID="0",
                            SLURM_LOCALID="2")) == "3"
    assert local_size(slurm(SLURM_TASKS_PER_NODE="3,2(x2)", SLURM_NODEID=None,
                            SLURM_LOCALID="2")) is None  # unknown node, uneven: derived later
    assert local_size(slurm(SLURM_TASKS_PER_NODE="2(x4)", SLURM_NODEID=None)) == "2"
    assert local_size(slurm(SLURM_TASKS_PER_NODE="2(x4)", SLURM_STEP_TASKS_PER_NODE="1(x8)",
                            SLURM_NODEID=None, SLURM_LOCALID="0")) == "1"  # the step's wins
    assert local_size(slurm(SLURM_TASKS_PER_NODE=None, SLURM_NTASKS_PER_NODE="4")) == "4"
    found = _launch.slurm_config(slurm(SLURM_TASKS_PER_NODE=None, SLURM_LOCALID=None,
                                       SLURM_NODEID=None))
    assert set(found) == {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


@pytest.mark.parametrize("changes,message", [
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
    ({"SLURM_PROCID": "8"}, "SLURM_PROCID=8 is not below SLURM_NTASKS=8"),
    ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS=0 is not a positive integer"),
    ({"SLURM_LOCALID": "-1"}, "SLURM_LOCALID=-1 is negative"),
    ({"SLURM_LOCALID": "4"}, "SLURM_LOCALID=4 is not below SLURM_TASKS_PER_NODE=4"),
    ({"SLURM_NODEID": "n1"}, "SLURM_NODEID='n1' is not an integer"),
    ({"SLURM_TASKS_PER_NODE": "4(x"},
     "SLURM_TASKS_PER_NODE='4(x' is not a Slurm task count list like '4(x2),3'"),
    ({"SLURM_TASKS_PER_NODE": "0(x2)"},
     "SLURM_TASKS_PER_NODE='0(x2)' is not a Slurm task count list like '4(x2),3'"),
    ({"SLURM_TASKS_PER_NODE": "4(2)"},
     "SLURM_TASKS_PER_NODE='4(2)' is not a Slurm task count list like '4(x2),3'"),
    ({"SLURM_TASKS_PER_NODE": "16(x2)"}, "SLURM_TASKS_PER_NODE=16 is above SLURM_NTASKS=8"),
    ({"SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID='12a' is not a non-negative integer (it sets the "
     "store port; or set MASTER_PORT)"),
    ({"SLURM_STEP_NODELIST": "gpu[07-"},
     "SLURM_STEP_NODELIST='gpu[07-' is not a Slurm node list like 'node[01-04],gpu7': "
     "'[' without ']'"),
    ({"SLURM_PROCID": None},
     "SLURM_PROCID is not set; the Slurm bootstrap needs tasks started by srun"),
    ({"SLURM_NTASKS": None},
     "SLURM_NTASKS is not set; the Slurm bootstrap needs tasks started by srun"),
    ({"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None},
     "none of MASTER_ADDR, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST is set; cannot tell which host "
     "runs rank 0"),
    ({"SLURM_JOB_ID": None},
     "neither MASTER_PORT nor SLURM_JOB_ID is set; cannot choose the store port"),
])
def test_errors(changes, message):
    with pytest.raises(ValueError) as raised:
        _launch.slurm_config(slurm(**changes))
    assert str(raised.value) == message


def test_older_size_name():
    assert _launch.slurm_config(slurm(SLURM_NTASKS=None, SLURM_NPROCS="8"))["WORLD_SIZE"] == "8"


@pytest.mark.parametrize("text,hosts", [
    ("node[01-03,7],gpu-a,rack2-[8-9]", "node01 node02 node03 node7 gpu-a rack2-8 rack2-9"),
    ("single", "single"), ("a,b,c", "a b c"), ("n[098-101]", "n098 n099 n100 n101"),
    ("n[8-10]", "n8 n9 n10"), ("n[5]", "n5"), ("n[007]", "n007"),
    ("r[1-2]-n[01-02]", "r1-n01 r1-n02 r2-n01 r2-n02"), ("[1-2]x,y[3,5]z", "1x 2x y3z y5z"),
    ("a[1-2],b[1-2]", "a1 a2 b1 b2"), ("10.0.0.[1-2]", "10.0.0.1 10.0.0.2"),
])
def test_nodelist(text, hosts):
    assert _launch.expand_slurm_nodelist(text) == hosts.split()


@pytest.mark.parametrize("text,why", [
    ("", "the list is empty"), ("node[1-", "'[' without ']'"), ("node1]", "unbalanced brackets"),
    ("node[3-1]", "range '3-1' runs backwards"),
    ("node[a-b]", "'a-b' in brackets is not a number or a range like 01-04"),
    ("node[]", "'' in brackets is not a number or a range like 01-04"),
    ("node[1,]", "'' in brackets is not a number or a range like 01-04"),
    ("node[1-2-3]", "'1-2-3' in brackets is not a number or a range like 01-04"),
    ("node[-3]", "'-3' in brackets is not a number or a range like 01-04"),
    ("a,,b", "an empty host name"), ("a,", "an empty host name"), ("n[[1]]", "unbalanced brackets"),
    ("n[0-99999999]", "it expands to more than 1048576 hosts"),
])
def test_nodelist_malformed(text, why):
    with pytest.raises(ValueError) as raised:
        _launch.expand_slurm_nodelist(text)
    assert str(raised.value) == "Slurm node list '%s' is malformed: %s" % (text, why)


TORCHRUN = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}


@pytest.mark.parametrize("env,kind", [
    ({}, "single"),
    (TORCHRUN, "env"),
    (dict(TORCHRUN, HORA_AGENT_STORE="h:1"), "agent"),
    (slurm(), "slurm"),
    (dict(slurm(), **TORCHRUN), "env"),  # torchrun's variables win over Slurm's
    (dict(slurm(), OMPI_COMM_WORLD_SIZE="2"), "mpi"),  # mpirun inside an allocation
    (dict(TORCHRUN, PMIX_RANK="0"), "mpi"),
    (dict(TORCHRUN, PMIX_RANK="0", HORA_BOOTSTRAP="env"), "env"),
    (dict(slurm(), HORA_BOOTSTRAP="env", OMPI_COMM_WORLD_SIZE="2"), "slurm"),
    (dict(TORCHRUN, HORA_BOOTSTRAP="single"), "single"),
    ({"HORA_BOOTSTRAP": "mpi"}, "mpi"),
    (dict(TORCHRUN, HORA_ELASTIC="1"), "elastic"),
    (slurm(SLURM_NTASKS=None, SLURM_NPROCS="8"), "single"),  # srun's task needs SLURM_NTASKS
    (dict(TORCHRUN, HORA_BOOTSTRAP="MPI"), None),  # hora_init() refuses it
])
def test_bootstrap_kind(env, kind):
    assert _launch.bootstrap_kind(env) == kind


def test_torch_env_from_slurm():
    assert _launch.torch_env_from_slurm(slurm()) == _launch.slurm_config(slurm())
    # kept where set; nothing where hora would not take its world from Slurm
    kept = _launch.torch_env_from_slurm(slurm(MASTER_PORT="4000", RANK="5", LOCAL_RANK=""))
    assert "MASTER_PORT" not in kept and "RANK" not in kept and kept["LOCAL_RANK"] == "1"
    assert "NODE_RANK" not in _launch.torch_env_from_slurm(slurm(GROUP_RANK="1"))
    for env in (dict(slurm(), **TORCHRUN), dict(slurm(), OMPI_COMM_WORLD_SIZE="8"),
                dict(slurm(), HORA_BOOTSTRAP="single"), {}):
        assert _launch.torch_env_from_slurm(env) == {}
    with pytest.raises(ValueError, match="SLURM_PROCID=9 is not below SLURM_NTASKS=8"):
        _launch.torch_env_from_slurm(slurm(SLURM_PROCID="9"))


def test_plan_without_torch(monkeypatch):
    """Where hora's world needs no port of its own, or torch is not loaded, hora_init() decides
    alone (torch's group cannot exist without torch)."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    for env in ({}, TORCHRUN, slurm(), dict(TORCHRUN, HORA_AGENT_STORE="h:1"),
                dict(TORCHRUN, OMPI_COMM_WORLD_SIZE="2"), dict(TORCHRUN, HORA_BOOTSTRAP="single"),
                dict(TORCHRUN, HORA_ELASTIC="1"), {"HORA_BOOTSTRAP": "mpi"}):
        plan = _launch.init_plan(env)
        assert (plan.wanted, plan.note, plan.borrowed) == ({}, "", None), env


def test_plan_borrows_torchs_store():
    """torch loaded, no group yet: hora opens torch's env:// store on MASTER_PORT (a world of one
    here) and agrees its own port through it; torch's group can then open it afresh."""
    dist = pytest.importorskip("torch.distributed")
    port = _launch._ports.free_port("127.0.0.1")  # pylint: disable=protected-access
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}
    plan = _launch.init_plan(env)
    assert plan.borrowed is not None and set(plan.wanted) == {"MASTER_PORT"}
    assert plan.wanted["MASTER_PORT"] != str(port)
    assert "torch.distributed's env:// store at 127.0.0.1:%d" % port in plan.note
    plan.borrowed = None  # closes it: the port is free again
    again = dist.TCPStore("127.0.0.1", port, 1, True)
    again.set("k", "v")
    assert again.get("k") == b"v"
    for env_bad in (dict(env, RANK="x"), dict(env, MASTER_PORT="0"), dict(env, RANK="1")):
        assert _launch.init_plan(env_bad).borrowed is None  # hora_init() says what is wrong


class FakeStore:
    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value.encode()

    def get(self, key):
        return self.data[key]


def test_agree_through_store():
    store = FakeStore()
    first = _launch.agree_through_store(store, 0, 2, TORCHRUN)
    assert set(first) == {"MASTER_PORT"} and 0 < int(first["MASTER_PORT"]) < 65536
    # the other rank reads what rank 0 wrote, under the same (next) key; a tcp:// group lacks
    # the variables, which come from torch's world
    count = _launch._rendezvous_count  # pylint: disable=protected-access
    store.set("hora.distributed/rendezvous/%d" % count, "host0 4321")
    second = _launch.agree_through_store(store, 1, 2, {})
    assert second == {"MASTER_PORT": "4321", "MASTER_ADDR": "host0", "RANK": "1",
                      "WORLD_SIZE": "2"}
