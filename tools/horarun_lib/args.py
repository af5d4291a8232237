# SPDX-License-Identifier: Apache-2.0
"""horarun's command line: the parser, its help (with hora's knobs from hora-info), the checks
argparse cannot do, and the program each rank runs (torchrun's rules)."""

import argparse
import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

from .common import HOST_RE, UsageError, say, tool_candidates

VERSION = "0.1.0"

# Command-line knob -> hora knob (lib/base/knobs.cpp validates the values at hora_init()).
KNOB_OPTIONS = [
    ("timeline", "HORA_TIMELINE"),
    ("log_level", "HORA_LOG_LEVEL"),
    ("fusion_threshold", "HORA_FUSION_THRESHOLD"),
    ("cycle_time_ms", "HORA_CYCLE_TIME_MS"),
    ("cache_capacity", "HORA_CACHE_CAPACITY"),
    ("timeout", "HORA_TIMEOUT_S"),
    ("cpu_backend", "HORA_CPU_BACKEND"),
]

# torchrun's --rdzv-conf keys that mean nothing to horarun's agents: accepted with a warning.
RDZV_CONF_IGNORED = ("timeout", "read_timeout", "close_timeout", "keep_alive_interval",
                     "keep_alive_max_attempt", "use_libuv", "store_type")
RDZV_BACKENDS = ("c10d", "static")

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# The agents' defaults that options change (--rdzv-conf last_call_timeout, --rdzv-endpoint).
LAST_CALL_S = 1.0        # once MIN agents are in, how long the leader waits for more
DEFAULT_RDZV_PORT = 29400  # torchrun's

EPILOG = """\
local mode (no -H/--hostfile):
  Starts -np ranks on this machine, each in its own session, with the variables torchrun sets:
  MASTER_ADDR (127.0.0.1), MASTER_PORT (a free port below the kernel's ephemeral range, reserved
  against other jobs' picks in /run/lock/hora-ports), RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, and HORA_BOOTSTRAP=env. MPI launcher variables (OMPI_*,
  PMI_*, PMIX_*, ...) and Slurm task variables (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
  SLURM_STEP_*, ...) are removed so that an outer mpirun or srun does not confuse the bootstrap.
  Each line of a rank's stdout (stderr) goes to horarun's stdout (stderr) whole, as "[RANK] line";
  a last line without a newline gets one.
  Rank 0 reads horarun's stdin; the other ranks read /dev/null. Output goes through pipes, so
  C stdio buffers a rank's stdout until fflush() or exit (python: -u or PYTHONUNBUFFERED=1).
  SIGINT, SIGTERM and SIGHUP are forwarded to every rank's process group; ranks still running
  --grace seconds later get SIGKILL (a second Ctrl-C sends it at once). SIGUSR1 and SIGUSR2 are
  passed on and nothing else happens. If horarun is SIGKILLed, Linux kills the ranks (not their
  children).
  When a rank exits non-zero or dies from a signal, horarun gives the other ranks --stop-after
  seconds to exit on their own (hora fails their pending operations at once, so they can report it
  and write their flight recorder files), then sends SIGTERM to those still running (SIGKILL after
  --grace seconds) and exits with the first failed rank's exit status, or 128 + the signal number.
  Exit status 0 means every rank exited 0; 128 + N means horarun itself received signal N; 127
  (126) means the program was not found (could not be executed).
  The failure summary, one line, names the rank that failed first, as torchrun's "root cause"
  does: "horarun: rank 2 exited with status 1 (ValueError: boom); stopping the other 3 ranks".
  First means by time, not by rank number or the order horarun noticed: a thread per rank notes
  the moment it exits, and a Python rank fails when it prints the traceback it dies with (its
  exit can come later, after atexit handlers such as hora's shutdown, while the ranks it left
  fail at once). The part in parentheses is that traceback's exception line, from the rank's
  stderr. Ranks horarun stopped are never named. A traceback counts when it came at most 10 s
  before the first exit and its rank printed nothing more on stdout (else the exception was
  handled). A rank still running that printed one before the first exit is waited for until
  --stop-after ends; still running then, the line says "rank 2 raised ValueError: boom and has
  not exited".
  Several machines without MPI: run horarun on each with --nnodes, --node-rank, --master-addr and
  --master-port; -np is then the number of ranks per machine and RANK = node rank * np + LOCAL_RANK.
  Job token: every rank also gets HORA_JOB_TOKEN, a fresh random secret (32 bytes, hex) for each
  job, so that only this job's ranks can join rank 0's store and the Gloo mesh; a process that
  cannot prove the token is refused and logged (docs/security.md). An HORA_JOB_TOKEN already set
  in horarun's environment (or given with -x) is passed on instead. With --nnodes above 1 the
  machines cannot agree on a random token: set the same HORA_JOB_TOKEN on each of them, or the
  store trusts whoever reaches its port.

agent mode (--max-restarts, --standalone, --rdzv-endpoint, --rdzv-backend c10d, --nnodes MIN:MAX,
--min-np, --max-np, --host-discovery-script):
  One horarun per host keeps its -np (--nproc-per-node) workers going. The agent on the
  --rdzv-endpoint host (or the only one: --standalone, the default without an endpoint) runs
  hora-store, the job's store, which outlives every worker; workers reach it through
  HORA_AGENT_STORE, so MASTER_ADDR/MASTER_PORT stay free for torch.distributed (a fresh port on
  node 0's host each round). Set the same HORA_JOB_TOKEN for every agent of several hosts.
  Restarts (torchrun's model): a round forms once MIN agents joined (waiting up to
  --rdzv-timeout), admits up to MAX; a failed rank stops every worker of every host, and all start
  again in a new round, up to --max-restarts times, with HORA_RESTART_COUNT and
  TORCHELASTIC_RESTART_COUNT set to the count; one line says why each round ended. A late or
  returning agent starts a new round without using a restart. The exit status is the failed
  rank's once no restart is left.
  Elastic (Horovod's model): a failed worker is not restarted; the others roll back to their
  last commit (hora.elastic.run) or call hora_shutdown() and hora_init(), which joins the next
  world. --host-discovery-script prints "host:slots" lines; each host runs that many workers
  (a failed worker's slot stays empty until the slots grow); newcomers join at the next commit.
  Output lines carry the worker's slot, not its rank, which changes.

the program (torchrun's rules):
  A program ending in .py, or a file that is not executable or has no "#!" line (a script path
  without "python"), runs with the Python that runs horarun (sys.executable), unbuffered:
  "horarun -np 2 train.py" runs "python3 -u train.py" on each rank, as torchrun does; -m PROGRAM
  runs "python3 -u -m PROGRAM". Commands on PATH (python3, bash), executables (./a.out, an
  executable script with "#!") and anything after --no-python run as they are; a file of this
  folder given without "./" that is executable runs as ./FILE. Under -H/--hostfile the same
  rules apply, and that Python's path must exist on every host.

torchrun's options:
  --nproc-per-node (-np), --nnodes, --node-rank, --master-addr, --master-port, --max-restarts,
  --standalone, --rdzv-endpoint, --rdzv-id, --rdzv-backend, --rdzv-conf, --local-addr, -m,
  --no-python, --log-dir, -r/--redirects, -t/--tee, --local-ranks-filter; a dash inside a name
  may be an underscore (--nproc_per_node), as torchrun allows. --role, --monitor-interval and
  --start-method are accepted and do nothing.
  --rdzv-backend static (torchrun's default): no agents; --rdzv-endpoint HOST:PORT is every rank's
  MASTER_ADDR:MASTER_PORT. --rdzv-backend c10d: horarun's agents (agent mode above), their store
  at --rdzv-endpoint, or served here without one. etcd and etcd-v2 are refused.
  --rdzv-conf join_timeout=S sets --rdzv-timeout, last_call_timeout=S how long a round that has
  MIN agents waits for more, is_host=true|false whether this agent serves the store (default:
  when the endpoint is one of this machine's addresses); timeout, read_timeout, close_timeout,
  keep_alive_interval, keep_alive_max_attempt, use_libuv and store_type are accepted with a
  warning and ignored; any other key is refused.
  Logs: with --log-dir DIR each rank's stdout and stderr also go to
  DIR/attempt_K/RANK/stdout.log and stderr.log, unprefixed (K: the round of agent mode, else 0;
  RANK: the rank, an elastic worker's slot). -r/--redirects N sends those streams to the files
  only, -t/--tee N to both (1 stdout, 2 stderr, 3 both, 0 none; "0:3,1:2" per LOCAL_RANK); when
  either is given, only the streams they name are logged, and without --log-dir the files go to
  a fresh directory that horarun names on stderr. The files of a second run replace the first's.
  Not with -H/--hostfile (mpirun's --output-filename does this there).

multi-host mode (-H or --hostfile):
  Runs the job through Open MPI's mpirun (which must be on every host): -np (default: the sum of
  the slots), --host, --bind-to none, --map-by slot, -x for every HORA_* and HOROVOD_* variable
  (hora reads Horovod's knobs too) and -x option, --tag-output (unless --no-prefix),
  --allow-run-as-root when run as root, --oversubscribe only when asked for, and the
  point-to-point layer from --pml. With auto, UCX's pml where Open MPI would select it: ompi_info
  lists it and UCX (ucx_info -d) offers a transport that its filter pml_ucx_tls allows on a
  device pml_ucx_devices names (by default InfiniBand/RoCE ones; elsewhere forcing it fails with
  "PML ucx cannot be selected"); else ob1 over tcp,vader,self (no btl flag when --mpirun-args
  sets one). No pml flags when --mpirun-args or OMPI_MCA_pml chooses the pml, or when ompi_info or
  ucx_info is missing (Open MPI then chooses). --dry-run prints the choice and why as a "# pml:"
  line before the command; the probes run on this machine only. hora forms the world through MPI
  there.
  HORA_JOB_TOKEN, when set, is passed as "-x HORA_JOB_TOKEN" (by name: the secret stays off
  the command line); hora's Gloo data plane under MPI makes its own token per world.
  Hostfile lines: "host slots=N", "host:N" or "host" (1 slot); "#" starts a comment.
"""

EXAMPLES = """\
examples:
  horarun -np 4 ./train --epochs 3
  horarun --nproc-per-node 2 train.py --lr 0.1
  horarun --nproc_per_node 2 --log-dir logs --redirects 3 -m pkg.train
  horarun -np 2 --no-prefix --timeline /tmp/hora.json python3 train.py
  horarun -np 8 -x OMP_NUM_THREADS=4 --log-level info ./bench
  horarun -H node1:4,node2:4 -x LD_LIBRARY_PATH ./train
  horarun --hostfile hosts.txt --cpu-backend gloo --dry-run ./train
  horarun -np 4 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 ./train
  horarun -np 4 --max-restarts 3 ./train
  horarun --nnodes 1:4 --nproc-per-node 8 --rdzv-endpoint node1:29400 --rdzv-id job7 ./train
  horarun -np 4 --min-np 2 --max-np 8 --host-discovery-script ./discover.sh python3 train.py
"""



# --help lists the knobs from hora-info --knobs-json (lib/base/knobs.cpp's table, the one source);
# this variable names the hora-info to ask (not HORA_*: horarun passes those on to the ranks).
HORA_INFO_VAR = "HORARUN_HORA_INFO"


def hora_info_candidates():
    return tool_candidates("hora-info", HORA_INFO_VAR)


def read_knobs(hora_info):
    """[(name, default, doc)] from `hora_info --knobs-json`; None if it cannot tell."""
    if not (os.path.isfile(hora_info) and os.access(hora_info, os.X_OK)):
        return None
    try:
        proc = subprocess.run([hora_info, "--knobs-json"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=10, check=True)
        return [(k["name"], k["default"], k["doc"]) for k in json.loads(proc.stdout)]
    except (OSError, subprocess.SubprocessError, ValueError, TypeError, KeyError):
        return None


def knob_help():
    """The knob section of --help, or a one-line note when no hora-info answers."""
    for candidate in hora_info_candidates():
        knobs = read_knobs(candidate)
        if knobs is not None:
            break
    else:
        return ("hora knobs: hora-info lists them (not found: $%s, beside horarun, "
                "build dirs, PATH)\n" % HORA_INFO_VAR)
    lines = ["hora knobs (HORA_* variables: set in horarun's environment or with -x NAME=VALUE, "
             "every rank", "gets them; the options above set some; hora-info shows their values):"]
    for name, default, doc in knobs:
        lines.append("  %s (default %s)" % (name, default or "unset"))
        lines += textwrap.wrap(doc, width=100, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines) + "\n"


class Parser(argparse.ArgumentParser):
    """Asks hora-info for the knobs only when the help is printed."""

    def format_help(self):
        self.epilog = EPILOG + "\n" + knob_help() + "\n" + EXAMPLES
        return super().format_help()


def gpu_count():
    """GPUs this machine shows as /dev/nvidiaN (what torchrun's 'gpu' counts through CUDA)."""
    try:
        return len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia[0-9]+", d)])
    except OSError:
        return 0


def rank_count(text):
    """-np's value: a number, or torchrun's cpu, gpu or auto."""
    if text == "cpu":
        return os.cpu_count() or 1
    if text in ("gpu", "auto"):
        gpus = gpu_count()
        if gpus:
            return gpus
        if text == "gpu":
            raise argparse.ArgumentTypeError("gpu: this machine shows no GPU (/dev/nvidiaN)")
        return os.cpu_count() or 1
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid int value: '%s' (or cpu, gpu, auto)" % text)


def plane_name(text):
    """--cpu-backend's value: auto or a plane's name, spelt as HORA_CPU_BACKEND's parser takes it.
    Which names are planes is the library's to say (hora-info lists them; hora_init refuses any
    other), so no list of them is kept here."""
    if not re.fullmatch(r"[a-z0-9_]+", text):
        raise argparse.ArgumentTypeError(
            "'%s': expected auto or a plane's name (lowercase letters, digits, _); hora-info "
            "lists this build's planes" % text)
    return text


def build_parser():
    p = Parser(
        prog="horarun",
        usage="horarun [options] PROGRAM [ARGS...]",
        description="Start a hora job: -np ranks on this machine with torchrun-style env://\n"
        "variables, or across hosts (-H, --hostfile) through Open MPI's mpirun.",
        epilog=EPILOG + "\n" + EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # Abbreviations would let "--time" mean --timeline or --timeout depending on the version.
        allow_abbrev=False)
    p.add_argument("--version", action="version", version="horarun (hora) " + VERSION)

    g = p.add_argument_group("ranks")
    g.add_argument("-np", "-n", "--np", "--nproc-per-node", "--nproc_per_node", dest="np",
                   type=rank_count, metavar="N",
                   help="number of ranks (local mode: on this machine, default 1; multi-host: in "
                   "all, default the sum of the slots; agents: per host); also torchrun's cpu "
                   "(one per CPU), gpu (one per /dev/nvidiaN) and auto (gpu if any, else cpu)")
    g.add_argument("-H", "--host", dest="hosts", metavar="HOST:N[,HOST:N...]",
                   help="run on these hosts through mpirun; N = slots (default 1)")
    g.add_argument("--hostfile", metavar="FILE",
                   help='hosts from FILE, lines "host slots=N", "host:N" or "host"')
    g.add_argument("--nnodes", default="1", metavar="N|MIN:MAX",
                   help="local mode: machines in the job, each running horarun (default 1); "
                   "MIN:MAX (with --rdzv-endpoint): agents, the job forms with MIN to MAX hosts")
    g.add_argument("--node-rank", "--node_rank", type=int, default=0, metavar="K",
                   help="local mode: this machine's index in [0, --nnodes) (default 0)")
    g.add_argument("--master-addr", "--master_addr", metavar="ADDR",
                   help="local mode: address of rank 0's store (default 127.0.0.1)")
    g.add_argument("--master-port", "--master_port", type=int, metavar="PORT",
                   help="local mode: its port (default: a free one below the kernel's ephemeral "
                        "range, which no other job on this machine can take before rank 0 binds it)")

    g = p.add_argument_group("the program (torchrun's rules, see below)")
    g.add_argument("-m", "--module", action="store_true",
                   help="PROGRAM is a Python module: each rank runs 'python -u -m PROGRAM ARGS'")
    g.add_argument("--no-python", "--no_python", action="store_true",
                   help="run PROGRAM as given, never through Python (not even a .py file)")
    # torchrun's options that mean nothing here: a script passing them still starts.
    g.add_argument("--role", metavar="NAME", help="accepted and ignored (torchrun's worker role)")
    g.add_argument("--monitor-interval", "--monitor_interval", type=float, metavar="S",
                   help="accepted and ignored (horarun notices an exit at once)")
    g.add_argument("--start-method", "--start_method", choices=["spawn", "fork", "forkserver"],
                   help="accepted and ignored (every rank is a process of its own)")

    g = p.add_argument_group("agents: restarts, rendezvous, elasticity (see below)")
    g.add_argument("--max-restarts", "--max_restarts", type=int, metavar="N",
                   help="restart every worker (a new round) up to N times after a failure "
                   "(default 0 in agent mode)")
    g.add_argument("--standalone", action="store_true",
                   help="one host, the rendezvous store served by this horarun (the default "
                   "for agents without --rdzv-endpoint)")
    g.add_argument("--rdzv-endpoint", "--rdzv_endpoint", metavar="HOST[:PORT]",
                   help="where the agents meet (default port %d); the agent on HOST serves "
                   "the store" % DEFAULT_RDZV_PORT)
    g.add_argument("--rdzv-backend", "--rdzv_backend", metavar="NAME",
                   help="c10d: horarun's agents and their store (the default with "
                   "--rdzv-endpoint); static: no agents, --rdzv-endpoint is then MASTER_ADDR:PORT "
                   "(the default otherwise); nothing else is accepted")
    g.add_argument("--rdzv-conf", "--rdzv_conf", action="append", default=[],
                   metavar="KEY=VALUE[,...]",
                   help="torchrun's rendezvous settings: join_timeout (= --rdzv-timeout), "
                   "last_call_timeout (seconds a round waits for more agents once MIN joined, "
                   "default %g), is_host (true: this agent serves the store; false: it never "
                   "does); %s are accepted with a warning and ignored; other keys are refused"
                   % (LAST_CALL_S, ", ".join(RDZV_CONF_IGNORED)))
    g.add_argument("--local-addr", "--local_addr", metavar="ADDR",
                   help="agents: the address other hosts reach this one at (its MASTER_ADDR "
                   "when it holds node rank 0; default: its address on the route to the "
                   "endpoint); accepted and unused without agents")
    g.add_argument("--rdzv-id", "--rdzv_id", default="default", metavar="ID",
                   help="the job's name in the store (default 'default')")
    g.add_argument("--rdzv-timeout", "--rdzv_timeout", type=float, default=300.0, metavar="S",
                   help="how long a round may wait for MIN hosts, or a new world for its "
                   "workers (default 300)")
    g.add_argument("--min-np", "--min_np", type=int, metavar="N",
                   help="elastic: the fewest workers training may go on with (default -np)")
    g.add_argument("--max-np", "--max_np", type=int, metavar="N",
                   help="elastic: the most workers in a world (default no limit)")
    g.add_argument("--host-discovery-script", "--host_discovery_script", metavar="PATH",
                   help="elastic: prints 'host:slots' lines; run every second by the agent at "
                   "the endpoint, each agent runs as many workers as its host's slots")

    g = p.add_argument_group("output and signals")
    # No -p: horovodrun's -p is its ssh port; one letter must not mean two things to a user.
    g.add_argument("--prefix", dest="prefix", action="store_true", default=True,
                   help='prefix each output line with "[RANK] " (the default)')
    g.add_argument("--no-prefix", dest="prefix", action="store_false",
                   help="pass output lines on unchanged")
    g.add_argument("--log-dir", "--log_dir", metavar="DIR",
                   help="also write each rank's output to DIR/attempt_K/RANK/stdout.log and "
                   "stderr.log (K: the round, 0 without restarts; RANK as in the [RANK] prefix); "
                   "alone, both streams of every rank (as --tee 3)")
    g.add_argument("-r", "--redirects", metavar="N|LOCAL:N[,...]",
                   help="torchrun's: send these streams to the log files only (1 stdout, 2 "
                   "stderr, 3 both, 0 none), for every local rank or per LOCAL_RANK (0:3,1:2)")
    g.add_argument("-t", "--tee", metavar="N|LOCAL:N[,...]",
                   help="the same spelling: these streams go to the log files and, as ever, "
                   "to horarun's output (--tee wins over --redirects); either without "
                   "--log-dir logs to a fresh directory, named on stderr")
    g.add_argument("--local-ranks-filter", "--local_ranks_filter", metavar="LOCAL[,LOCAL...]",
                   help="torchrun's: show only these local ranks' output on horarun's stdout "
                   "and stderr (the log files still get theirs)")
    g.add_argument("--grace", type=float, default=5.0, metavar="S",
                   help="seconds between SIGTERM (or a forwarded signal) and SIGKILL (default 5)")
    g.add_argument("--stop-after", type=float, default=2.0, metavar="S",
                   help="seconds the other ranks get to exit on their own after a rank fails, "
                   "before SIGTERM (default 2)")
    g.add_argument("--dry-run", action="store_true",
                   help="print the mpirun command (after a '# pml:' line saying why that pml), "
                   "or each local rank's command line with its variables, and start nothing")

    g = p.add_argument_group("hora settings (passed to every rank as HORA_* variables)")
    g.add_argument("--timeline", metavar="PATH", help="HORA_TIMELINE: Chrome-trace JSON timeline")
    g.add_argument("--log-level", "--log_level", type=str.lower,
                   choices=["trace", "debug", "info", "warning", "error"],
                   help="HORA_LOG_LEVEL (any case: INFO is info)")
    g.add_argument("--fusion-threshold", metavar="BYTES",
                   help="HORA_FUSION_THRESHOLD: largest fused buffer (e.g. 67108864, 64M)")
    g.add_argument("--cycle-time-ms", metavar="MS", help="HORA_CYCLE_TIME_MS")
    g.add_argument("--cache-capacity", metavar="N", help="HORA_CACHE_CAPACITY (0 disables)")
    g.add_argument("--timeout", metavar="S", help="HORA_TIMEOUT_S")
    g.add_argument("--cpu-backend", type=plane_name, metavar="NAME",
                   help="HORA_CPU_BACKEND: auto or a CPU plane's name (hora-info lists this "
                   "build's; hora_init refuses any other)")
    g.add_argument("-x", dest="exports", action="append", default=[], metavar="NAME[=VALUE]",
                   help="set NAME=VALUE for every rank; NAME alone passes this environment's value "
                   "(repeatable)")

    g = p.add_argument_group("multi-host (Open MPI)")
    g.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than slots (passes --oversubscribe)")
    g.add_argument("--pml", choices=["auto", "ucx", "ob1"], default="auto",
                   help="point-to-point layer (default auto: ucx where Open MPI can select it, "
                   "else ob1; --dry-run says why)")
    g.add_argument("--mpirun", default="mpirun", metavar="PATH",
                   help="the mpirun to use (default: mpirun on PATH)")
    g.add_argument("--mpirun-args", default="", metavar="'ARGS'",
                   help="more mpirun arguments, one shell-quoted string")

    p.add_argument("command", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]",
                   help="the program every rank runs, and its arguments")
    return p


def parse_exports(items, environ):
    """-x NAME=VALUE / -x NAME -> ordered {NAME: VALUE}; raises UsageError."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not ENV_NAME_RE.match(name):
            raise UsageError("-x %s: expected NAME=VALUE or NAME" % item)
        if not eq:
            if name not in environ:
                raise UsageError("-x %s: %s is not set in this environment" % (item, name))
            value = environ[name]
        out[name] = value
    return out


def check_args(args):
    """Semantic checks argparse cannot do; raises UsageError."""
    command = args.command
    # Python versions differ on whether REMAINDER keeps a leading "--".
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no program to run (usage: horarun [options] PROGRAM [ARGS...])")
    args.program = command[0]
    args.command = program_argv(args, command)
    check_torchrun_args(args)
    if args.np is not None and args.np < 1:
        raise UsageError("-np %d: need at least one rank" % args.np)
    if args.grace < 0:
        raise UsageError("--grace %g: must not be negative" % args.grace)
    if args.stop_after < 0:
        raise UsageError("--stop-after %g: must not be negative" % args.stop_after)
    if args.hosts is not None and args.hostfile is not None:
        raise UsageError("-H and --hostfile exclude each other")
    args.multi_host = args.hosts is not None or args.hostfile is not None
    m = re.fullmatch(r"([0-9]+)(?::([0-9]+))?", args.nnodes)
    if not m:
        raise UsageError("--nnodes %s: expected N or MIN:MAX" % args.nnodes)
    args.nnodes_text = args.nnodes
    args.nnodes_min = int(m.group(1))
    args.nnodes_max = int(m.group(2) or m.group(1))
    if not 1 <= args.nnodes_min <= args.nnodes_max:
        raise UsageError("--nnodes %s: need 1 <= MIN <= MAX" % args.nnodes)
    args.nnodes = args.nnodes_max
    args.elastic = (args.min_np is not None or args.max_np is not None or
                    args.host_discovery_script is not None)
    args.agent = (args.elastic or args.max_restarts is not None or args.standalone or
                  args.rdzv_endpoint is not None or m.group(2) is not None or
                  args.rdzv_backend == "c10d")
    if args.rdzv_backend == "static" and args.agent and args.nnodes_max > 1:
        raise UsageError("--rdzv-backend static has no agents to restart or resize a job of "
                         "several hosts (--max-restarts, --nnodes MIN:MAX, elastic options): "
                         "use --rdzv-backend c10d with --rdzv-endpoint")
    if args.multi_host and args.logging:
        raise UsageError("--log-dir, --redirects and --tee are for ranks horarun starts; under "
                         "mpirun use --mpirun-args '--output-filename DIR'")
    if args.agent:
        check_agent_args(args)
        return
    if args.multi_host:
        if args.nnodes != 1 or args.node_rank != 0:
            raise UsageError("--nnodes/--node-rank are for local mode; -H and --hostfile place "
                             "ranks through mpirun")
        if args.master_addr is not None or args.master_port is not None:
            raise UsageError("--master-addr/--master-port are for local mode; under mpirun hora "
                             "forms the world through MPI")
    else:
        if args.nnodes < 1:
            raise UsageError("--nnodes %d: need at least one machine" % args.nnodes)
        if not 0 <= args.node_rank < args.nnodes:
            raise UsageError("--node-rank %d: must be in [0, %d)" % (args.node_rank, args.nnodes))
        if args.nnodes > 1 and (args.master_addr is None or args.master_port is None):
            raise UsageError("--nnodes %d needs --master-addr and --master-port: every machine "
                             "must name the same store" % args.nnodes)
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise UsageError("--master-port %d: not a TCP port" % args.master_port)
    try:
        shlex.split(args.mpirun_args)
    except ValueError as e:
        raise UsageError("--mpirun-args: %s" % e)


def program_argv(args, command):
    """What each rank runs, by torchrun's rules: a Python script or module runs with horarun's
    own interpreter (unbuffered, as torchrun does); executables run as they are."""
    if args.module and args.no_python:
        raise UsageError("-m runs a module with Python, --no-python runs no Python: use one")
    python = [sys.executable or "python3", "-u"]
    if args.no_python:
        return command
    if args.module:
        return python + ["-m"] + command
    program = command[0]
    if program.endswith(".py"):
        return python + command
    if "/" not in program and shutil.which(program):
        return command  # a command on PATH: python3, bash, a tool
    if not os.path.isfile(program):
        return command  # not found: the start says so
    try:
        with open(program, "rb") as f:
            head = f.readline(256)
    except OSError:
        return command
    if os.access(program, os.X_OK) and head.startswith((b"\x7fELF", b"#!")):
        return command if "/" in program else [os.path.join(".", program)] + command[1:]
    if head.startswith(b"#!") and b"python" not in head:
        return command  # another interpreter's script, not executable: the start says so
    # A file without the execute bit or a usable "#!" line: a Python script, as torchrun
    # takes any training script.
    return python + command


def missing_script(args):
    """'cannot start ...' when Python would be given a script that is not there, else None."""
    if args.no_python or args.module or args.command[0] == args.program:
        return None
    if os.path.isfile(args.program):
        return None
    return "cannot start %s: %s" % (args.program, os.strerror(errno.ENOENT))


def parse_stream_spec(text, option):
    """torchrun's --redirects/--tee value: 'N' (every local rank) or 'LOCAL:N,...' ->
    (default mask, {local rank: mask}); 1 stdout, 2 stderr, 3 both."""
    def mask(word):
        if word not in ("0", "1", "2", "3"):
            raise UsageError("%s %s: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), "
                             "or LOCAL_RANK:N,..." % (option, text))
        return int(word)
    if ":" not in text:
        return mask(text.strip()), {}
    per_rank = {}
    for item in text.split(","):
        local, sep, value = item.strip().partition(":")
        if not sep or not local.isdigit():
            raise UsageError("%s %s: expected N or LOCAL_RANK:N,..." % (option, text))
        per_rank[int(local)] = mask(value.strip())
    return 0, per_rank


def parse_rdzv_conf(items):
    """--rdzv-conf k=v,k=v (repeatable) -> {key: value}; raises UsageError."""
    conf = {}
    for item in items:
        for word in item.split(","):
            if not word.strip():
                continue
            key, eq, value = word.strip().partition("=")
            if not eq or not key:
                raise UsageError("--rdzv-conf %s: expected KEY=VALUE[,KEY=VALUE...]" % item)
            conf[key] = value
    return conf


def check_torchrun_args(args):
    """torchrun's --rdzv-backend, --rdzv-conf, --local-addr, --redirects, --tee."""
    backend = args.rdzv_backend
    if backend is not None and backend not in RDZV_BACKENDS:
        raise UsageError("--rdzv-backend %s is not supported: horarun accepts c10d (its "
                         "agents' store) and static (MASTER_ADDR:MASTER_PORT, no agents)" % backend)
    if backend == "static" and args.rdzv_endpoint is not None:
        # torchrun's static rendezvous meets at the endpoint: that is rank 0's store.
        host, sep, port = args.rdzv_endpoint.rpartition(":")
        if not sep or not HOST_RE.match(host) or not port.isdigit():
            raise UsageError("--rdzv-endpoint %s: --rdzv-backend static needs HOST:PORT (the "
                             "MASTER_ADDR and MASTER_PORT of every rank)" % args.rdzv_endpoint)
        # Port 0 (torchrun's "localhost:0"): a free port, which only one machine can know.
        port = int(port) or None
        for given, value, name in ((args.master_addr, host, "--master-addr"),
                                   (args.master_port, port, "--master-port")):
            if given is not None and given != value:
                raise UsageError("--rdzv-endpoint %s and %s %s disagree" % (
                    args.rdzv_endpoint, name, given))
        args.master_addr, args.master_port = host, port
        args.rdzv_endpoint = None
    if args.local_addr is not None and not HOST_RE.match(args.local_addr):
        raise UsageError("--local-addr %s: expected a host name or address" % args.local_addr)
    args.is_host = None
    args.last_call_s = LAST_CALL_S
    for key, value in parse_rdzv_conf(args.rdzv_conf).items():
        if key in ("join_timeout", "last_call_timeout"):
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if seconds <= 0:
                raise UsageError("--rdzv-conf %s=%s: expected seconds above 0" % (key, value))
            if key == "join_timeout":
                args.rdzv_timeout = seconds
            else:
                args.last_call_s = seconds
        elif key == "is_host":
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise UsageError("--rdzv-conf is_host=%s: expected true or false" % value)
            args.is_host = value.lower() in ("true", "1", "yes")
        elif key in RDZV_CONF_IGNORED:
            say("--rdzv-conf %s=%s: horarun's store has no such setting; ignored" % (key, value))
        else:
            raise UsageError("--rdzv-conf %s: unknown key (horarun uses join_timeout, "
                             "last_call_timeout and is_host; it ignores %s)"
                             % (key, ", ".join(RDZV_CONF_IGNORED)))
    args.redirect_spec = parse_stream_spec(args.redirects, "--redirects") if args.redirects \
        else (0, {})
    args.tee_spec = parse_stream_spec(args.tee, "--tee") if args.tee else \
        ((3, {}) if args.log_dir is not None and not args.redirects else (0, {}))
    args.logging = args.log_dir is not None or args.redirects is not None or args.tee is not None
    args.shown_ranks = None
    if args.local_ranks_filter is not None:
        words = [w.strip() for w in args.local_ranks_filter.split(",")]
        if not all(w.isdigit() for w in words):
            raise UsageError("--local-ranks-filter %s: expected local ranks, e.g. 0 or 0,1"
                             % args.local_ranks_filter)
        args.shown_ranks = {int(w) for w in words}


def check_agent_args(args):
    """Agent mode: --max-restarts, --standalone, --rdzv-*, --nnodes MIN:MAX, elastic options."""
    if args.multi_host:
        raise UsageError("-H/--hostfile start ranks through mpirun; agents (--max-restarts, "
                         "--rdzv-endpoint, --min-np, ...) run one horarun per host instead")
    if args.node_rank != 0 or args.master_addr is not None or args.master_port is not None:
        raise UsageError("agents assign node ranks and serve the store at --rdzv-endpoint: "
                         "drop --node-rank/--master-addr/--master-port")
    if args.max_restarts is None:
        args.max_restarts = 0
    if args.max_restarts < 0:
        raise UsageError("--max-restarts %d: must not be negative" % args.max_restarts)
    if args.np is None:
        args.np = 1
    if args.rdzv_timeout <= 0:
        raise UsageError("--rdzv-timeout %g: must be positive" % args.rdzv_timeout)
    if args.standalone and args.rdzv_endpoint is not None:
        raise UsageError("--standalone serves the store here; it excludes --rdzv-endpoint")
    if args.rdzv_endpoint is None:
        if args.nnodes_max > 1:
            raise UsageError("--nnodes %s needs --rdzv-endpoint HOST[:PORT]: where the agents "
                             "of the hosts meet" % args.nnodes_text)
        args.standalone = True
        args.rdzv_host, args.rdzv_port = "127.0.0.1", 0
    else:
        host, sep, port = args.rdzv_endpoint.rpartition(":")
        if not sep:
            host, port = args.rdzv_endpoint, str(DEFAULT_RDZV_PORT)
        if not HOST_RE.match(host) or not port.isdigit() or not 0 <= int(port) < 65536:
            raise UsageError("--rdzv-endpoint %s: expected HOST or HOST:PORT" % args.rdzv_endpoint)
        args.rdzv_host, args.rdzv_port = host, int(port)
        if args.rdzv_port == 0:
            # torchrun's "localhost:0": one host, its store on a free port, as --standalone.
            if args.nnodes_max > 1:
                raise UsageError("--rdzv-endpoint %s: port 0 (a free port) is for one host; "
                                 "agents of several hosts must name the same port"
                                 % args.rdzv_endpoint)
            args.standalone = True
            args.rdzv_host = "127.0.0.1"
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", args.rdzv_id):
        raise UsageError("--rdzv-id %s: letters, digits, '_', '.' and '-' only" % args.rdzv_id)
    if args.elastic:
        if args.max_restarts:
            raise UsageError("--max-restarts restarts every worker; elastic jobs (--min-np, "
                             "--max-np, --host-discovery-script) carry on without a restart")
        if args.min_np is None:
            args.min_np = args.np
        if args.max_np is None:
            args.max_np = 1 << 30
        if not 1 <= args.min_np <= args.max_np:
            raise UsageError("--min-np %d --max-np %d: need 1 <= min <= max" % (args.min_np,
                                                                                  args.max_np))
        if args.host_discovery_script is not None and not os.access(args.host_discovery_script,
                                                                    os.X_OK):
            raise UsageError("--host-discovery-script %s: not an executable file"
                             % args.host_discovery_script)


def knob_env(args, environ):
    """The HORA_* settings and -x variables every rank gets, in command-line order."""
    env = {}
    for dest, name in KNOB_OPTIONS:
        value = getattr(args, dest)
        if value is not None:
            env[name] = str(value)
    env.update(parse_exports(args.exports, environ))
    return env
