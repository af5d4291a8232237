# SPDX-License-Identifier: Apache-2.0
"""Multi-host mode: the hosts (-H, --hostfile), the point-to-point layer Open MPI can select
(ompi_info, ucx_info), and the mpirun command that horarun then becomes."""

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys

from .common import HOST_RE, TOKEN_VAR, UsageError, say

def parse_host_list(text):
    """'a:4,b,c:2' -> [('a', 4), ('b', 1), ('c', 2)]; raises UsageError."""
    hosts = []
    for item in text.split(","):
        name, sep, slots = item.strip().partition(":")
        if not HOST_RE.match(name) or (sep and not re.fullmatch(r"[0-9]+", slots)):
            raise UsageError("bad host '%s' in -H %s: expected HOST or HOST:SLOTS" % (item, text))
        count = int(slots) if sep else 1
        if count < 1:
            raise UsageError("host '%s' in -H %s has no slots" % (item, text))
        hosts.append((name, count))
    return hosts


def parse_hostfile(path):
    """Reads 'host slots=N' / 'host:N' / 'host' lines; raises UsageError."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError("cannot read hostfile %s: %s" % (path, e.strerror or e))
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = "hostfile %s line %d" % (path, number)
        name, sep, slots = words[0].partition(":")
        count = None
        if sep:
            if not re.fullmatch(r"[0-9]+", slots):
                raise UsageError("%s: bad slot count in '%s'" % (where, words[0]))
            count = int(slots)
        for word in words[1:]:
            key, eq, value = word.partition("=")
            # max_slots is Open MPI's limit for oversubscription; the slots are what count here.
            if not eq or key not in ("slots", "max_slots", "max-slots") or \
                    not re.fullmatch(r"[0-9]+", value):
                raise UsageError("%s: cannot parse '%s' (expected slots=N)" % (where, word))
            if key == "slots":
                if count is not None:
                    raise UsageError("%s: slots given twice" % where)
                count = int(value)
        if not HOST_RE.match(name):
            raise UsageError("%s: bad host name '%s'" % (where, name))
        if count is not None and count < 1:
            raise UsageError("%s: host %s has no slots" % (where, name))
        hosts.append((name, 1 if count is None else count))
    if not hosts:
        raise UsageError("hostfile %s names no hosts" % path)
    return hosts


def merge_hosts(hosts):
    """Adds up the slots of a host named twice, keeping the order of first appearance."""
    merged = {}
    for name, slots in hosts:
        merged[name] = merged.get(name, 0) + slots
    return list(merged.items())


def find_beside_mpirun(mpirun, tool):
    """`tool` of the same installation as mpirun, else the one on PATH."""
    path = shutil.which(mpirun)
    if path:
        for folder in (os.path.dirname(os.path.realpath(path)), os.path.dirname(path)):
            beside = os.path.join(folder, tool)
            if os.access(beside, os.X_OK):
                return beside
    return shutil.which(tool)


def find_ompi_info(mpirun):
    return find_beside_mpirun(mpirun, "ompi_info")


def mca_settings(words):
    """{name: value} of every '--mca NAME VALUE' (or -mca, --gmca) in an mpirun argument list."""
    out = {}
    for i, word in enumerate(words[:-2]):
        if word in ("--mca", "-mca", "--gmca", "-gmca"):
            out[words[i + 1]] = words[i + 2]
    return out


def run_probe(argv, env=None):
    """stdout of a probe command as text, or None when it cannot be run."""
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env=env, timeout=20, check=False).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return None


def ucx_resources(mpirun):
    """[(transport, device)] that UCX can open on this machine (`ucx_info -d`), None if unknown."""
    ucx_info = find_beside_mpirun(mpirun, "ucx_info")
    out = run_probe([ucx_info, "-d"]) if ucx_info else None
    if not out:
        return None
    found = []
    transport = None
    for line in out.splitlines():
        m = re.match(r"#\s*Transport:\s*(\S+)", line)
        if m:
            transport = m.group(1)
            continue
        m = re.match(r"#\s*Device:\s*(\S+)", line)
        if m and transport is not None:
            found.append((transport, m.group(1)))
            transport = None
    return found


def ucx_support(resources, tls, devices):
    """Open MPI's test (opal_common_ucx_support_level): 'device' when a transport pml_ucx_tls
    allows runs on a device pml_ucx_devices names (UCX's pml then outranks ob1), 'transport' when
    only the transport matches (UCX's pml ranks below ob1), None when it cannot be selected."""
    tl_list = [t for t in tls.lstrip("^").split(",") if t]
    negate = tls.startswith("^")
    dev_list = [d for d in devices.split(",") if d]

    def tl_ok(tl):
        if tls == "any":
            return True
        return (tl not in tl_list) if negate else (tl in tl_list)

    def dev_ok(dev):
        return devices == "any" or any(fnmatch.fnmatchcase(dev, pat) for pat in dev_list)

    # Named in the reason: a network transport rather than UCX's loopback "self" where possible.
    ordered = sorted(resources, key=lambda r: r[0] == "self")
    for tl, dev in ordered:
        if tl_ok(tl) and dev_ok(dev):
            return "device", (tl, dev)
    for tl, dev in ordered:
        if tl_ok(tl):
            return "transport", (tl, dev)
    return None, None


def choose_pml(args, environ):
    """(pml to force or None, pml to show, why): the point-to-point layer of a multi-host job.

    Open MPI 4.1 selects its UCX pml only where UCX offers one of the transports in pml_ucx_tls
    (InfiniBand and RoCE ones by default); forcing it elsewhere fails with "PML ucx cannot be
    selected". So auto asks ompi_info for that filter and ucx_info for UCX's transports."""
    user = mca_settings(shlex.split(args.mpirun_args))
    if "pml" in user:
        return None, user["pml"], "--mca pml in --mpirun-args; horarun adds no pml flags"
    if args.pml != "auto":
        return args.pml, args.pml, "--pml %s" % args.pml
    if environ.get("OMPI_MCA_pml"):
        return None, environ["OMPI_MCA_pml"], "OMPI_MCA_pml; horarun adds no pml flags"
    ompi_info = find_ompi_info(args.mpirun)
    if ompi_info is None:
        return None, "Open MPI's choice", "ompi_info not found"
    # ompi_info reports the values this job would see: the environment's and --mpirun-args'.
    probe_env = dict(environ)
    probe_env.update({"OMPI_MCA_" + k: v for k, v in user.items()})
    out = run_probe([ompi_info, "--param", "pml", "ucx", "--level", "9"], probe_env)
    if out is None:
        return None, "Open MPI's choice", "%s failed" % ompi_info
    if not re.search(r"MCA pml:\s*ucx\b", out):
        return "ob1", "ob1", "this Open MPI has no UCX pml"

    def param(name):
        m = re.search(r'parameter "%s" \(current value: "([^"]*)"' % name, out)
        return m.group(1) if m else None

    tls, devices = param("pml_ucx_tls"), param("pml_ucx_devices")
    if tls is None:
        return "ucx", "ucx", "this Open MPI has the UCX pml, with no transport filter " \
            "(pml_ucx_tls)"
    resources = ucx_resources(args.mpirun)
    if resources is None:
        return None, "Open MPI's choice", "ucx_info not found, so whether UCX's pml can be " \
            "selected is unknown"
    level, match = ucx_support(resources, tls, devices or "any")
    offered = ",".join(sorted({tl for tl, _ in resources})) or "nothing"
    if level == "device":
        return "ucx", "ucx", "UCX offers %s on %s (pml_ucx_tls=%s, pml_ucx_devices=%s)" % (
            match[0], match[1], tls, devices)
    if level == "transport":
        return "ob1", "ob1", "UCX's %s on %s passes pml_ucx_tls but no device matches " \
            "pml_ucx_devices=%s, so Open MPI ranks UCX's pml below ob1" % (match[0], match[1],
                                                                           devices)
    return "ob1", "ob1", "UCX's pml cannot be selected here: pml_ucx_tls=%s and UCX offers " \
        "%s" % (tls, offered)


def mpirun_command(args, hosts, knobs, environ):
    total_slots = sum(n for _, n in hosts)
    np = args.np if args.np is not None else total_slots
    if np > total_slots and not args.oversubscribe:
        raise UsageError("-np %d is more than the %d slots of the hosts; add --oversubscribe"
                         % (np, total_slots))
    cmd = [args.mpirun, "-np", str(np),
           "--host", ",".join("%s:%d" % h for h in hosts),
           "--bind-to", "none", "--map-by", "slot"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")  # Open MPI refuses root otherwise (containers, CI)
    if args.oversubscribe:
        cmd.append("--oversubscribe")
    if args.prefix:
        cmd.append("--tag-output")
    pml = args.pml_choice[0]
    if pml == "ucx":
        cmd += ["--mca", "pml", "ucx"]
    elif pml == "ob1":
        cmd += ["--mca", "pml", "ob1"]
        if "btl" not in mca_settings(shlex.split(args.mpirun_args)):
            cmd += ["--mca", "btl", "tcp,vader,self"]
    # Open MPI forwards no variables unless told; every rank needs the same hora settings.
    exported = {k: v for k, v in environ.items() if k.startswith(("HORA_", "HOROVOD_"))}
    exported.update(knobs)
    for name in sorted(k for k in exported if k not in knobs) + list(knobs):
        if name == TOKEN_VAR:
            continue
        cmd += ["-x", "%s=%s" % (name, exported[name])]
    if exported.get(TOKEN_VAR):
        # By name: mpirun reads it from its own environment, and `ps` does not show it.
        cmd += ["-x", TOKEN_VAR]
    cmd += shlex.split(args.mpirun_args)
    return cmd + list(args.command)


def run_multi_host(args, knobs):
    if knobs.get(TOKEN_VAR):
        os.environ[TOKEN_VAR] = knobs[TOKEN_VAR]  # forwarded by name (see mpirun_command)
    hosts = parse_hostfile(args.hostfile) if args.hostfile else parse_host_list(args.hosts)
    args.pml_choice = choose_pml(args, os.environ)
    cmd = mpirun_command(args, merge_hosts(hosts), knobs, os.environ)
    if args.dry_run:
        _, shown, why = args.pml_choice
        print("# pml: %s (%s)" % (shown, why))
        print(" ".join(shlex.quote(w) for w in cmd))
        return 0
    if shutil.which(args.mpirun) is None:
        say("%s not found; multi-host jobs (-H, --hostfile) need Open MPI's mpirun" % args.mpirun)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    # mpirun takes over this process: signals, output and exit status are then its own.
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        say("cannot run %s: %s" % (cmd[0], e.strerror or e))
        return 126
