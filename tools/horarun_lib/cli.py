# SPDX-License-Identifier: Apache-2.0
"""horarun's main(): the command line checked, then one of the modes run."""

import os
import sys
import tempfile

from .args import build_parser, check_args, knob_env, missing_script
from .common import UsageError, say
from .elastic import run_elastic_agent
from .local import run_local
from .mpirun import run_multi_host
from .restart import run_restart_agent


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        knobs = knob_env(args, os.environ)
        missing = None if args.dry_run or args.multi_host else missing_script(args)
        if missing is not None:
            say(missing)
            return 127
        if args.logging and args.log_dir is None and not args.dry_run and not args.multi_host:
            args.log_dir = tempfile.mkdtemp(prefix="horarun-logs-")
            say("rank logs (--redirects/--tee) in %s" % args.log_dir)
        if args.multi_host:
            return run_multi_host(args, knobs)
        if args.agent:
            if args.dry_run:
                print("# agent: %d workers here, %s, store %s" % (
                    args.np, "elastic (min %d, max %d workers)" % (args.min_np, args.max_np)
                    if args.elastic else "up to %d restarts, %s hosts" % (args.max_restarts,
                                                                         args.nnodes_text),
                    "served here" if args.standalone else "at %s:%d" % (args.rdzv_host,
                                                                       args.rdzv_port))
                      + ", join timeout %g s, last call %g s" % (args.rdzv_timeout,
                                                                 args.last_call_s))
                return 0
            return run_elastic_agent(args, knobs) if args.elastic else \
                run_restart_agent(args, knobs)
        if args.np is None:
            args.np = 1
        return run_local(args, knobs)
    except UsageError as e:
        parser.print_usage(sys.stderr)
        parser.exit(2, "horarun: error: %s\n" % e)
