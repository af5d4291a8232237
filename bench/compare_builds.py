#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Before against after: hora-bench from two build trees, in one run, alternating.

    bench/compare_builds.py --old OLD_BUILD --new NEW_BUILD [--runs 5] [--sizes 4,4K,1M,64M]
        [--planes shm,mpi,gloo,ucx] [--np 2] [--coll allreduce] [--iters N] [--raw FILE]
        [-- LAUNCHER...]
    bench/compare_builds.py --pool RAW [RAW...]

Each run times every size on every plane with the old build's hora-bench and then the new one's
(the order swapped every other run, so that a machine that slows down over the run does not
favour one side). A plane is `shm` (hora's own choice on one host: the shared segment) or a CPU
plane with HORA_SHM=off (mpi, gloo, ucx: the plane itself). Prints one markdown table: per plane
and size, the median and mean over the runs of hora's out-of-place time per op (each run's
figure is hora-bench's median of --trials loops), new / old of the medians, and a 95% interval
for that ratio (a bootstrap over the runs). Above 1.05 is a slowdown beyond the 5% the project
allows (marked), but only a ratio whose interval lies above 1.05 has shown one: runs of small
messages across namespace hosts spread by a third from one job's start to the next, and 9
runs leave an interval about 0.2 wide.

--raw FILE keeps every run's figure (JSON); --pool reads such files, from separate invocations
with the same builds, and prints the table over all their runs.

The launcher defaults to mpirun with tools/mpirun_flags.sh's HORA_MPIRUN_BENCH_ARGS (2 ranks,
one core each). Exit status 0 whatever the figures: this reports, it does not judge.
"""
import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_size(text):
    units = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def human(size):
    for unit, shift in (('G', 30), ('M', 20), ('K', 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f'{size >> shift} {unit}iB'
    return f'{size} B'


def default_launcher(np):
    flags = subprocess.run(['bash', '-c', f'source {shlex.quote(ROOT)}/tools/mpirun_flags.sh && '
                            'printf "%s\\n" "${HORA_MPIRUN_BENCH_ARGS[@]}"'],
                           check=True, capture_output=True, text=True).stdout.split('\n')
    return ['mpirun'] + [f for f in flags if f] + ['-np', str(np)]


def run_bench(launcher, build, coll, size, plane, iters, trials):
    """hora's out-of-place time per op (us) at `size` on `plane`, from one hora-bench run."""
    env = dict(os.environ)
    planes = 'auto'
    if plane != 'shm':
        env['HORA_SHM'] = 'off'
        planes = plane
    with tempfile.NamedTemporaryFile(suffix='.json') as out:
        argv = launcher + [os.path.join(build, 'bench', 'hora-bench'), coll, '-b', str(size), '-e', str(size),
                           '-w', '5', '-n', str(iters), '--trials', str(trials), '--planes', planes,
                           '--mpi', '0', '--gloo', '0', '--memcpy', '0', '-c', '1', '--json', out.name]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-2000:] + done.stderr[-2000:])
            raise SystemExit(f'hora-bench failed ({done.returncode}): {shlex.join(argv)}')
        report = json.load(open(out.name))
    if report.get('wrong'):
        raise SystemExit(f'{build}: {plane} {size}: wrong results')
    row = report['rows'][0]
    name = plane if plane != 'shm' else next(iter(row['hora_planes']))
    return row['hora_planes'][name]['out_of_place']['time_us']


def ratio_interval(old, new, draws=2000):
    """95% bootstrap interval of median(new) / median(old), runs resampled on each side."""
    rng = random.Random(1)  # the same figures give the same interval
    ratios = sorted(statistics.median(rng.choices(new, k=len(new))) /
                    statistics.median(rng.choices(old, k=len(old))) for _ in range(draws))
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def print_table(times, title):
    print(title)
    print()
    print('| plane | size | runs | old median | new median | new / old | 95% interval | old mean | new mean |')
    print('|---|---|---|---|---|---|---|---|---|')
    for (plane, size) in dict.fromkeys((k[0], k[1]) for k in times):
        old, new = times[(plane, size, 'old')], times[(plane, size, 'new')]
        ratio = statistics.median(new) / statistics.median(old)
        low, high = ratio_interval(old, new)
        flag = ' (slower)' if ratio > 1.05 else ''
        print(f'| {plane} | {size} | {len(old)} | {statistics.median(old):.3g} | '
              f'{statistics.median(new):.3g} | {ratio:.3f}{flag} | {low:.2f}-{high:.2f} | '
              f'{statistics.mean(old):.3g} | {statistics.mean(new):.3g} |')


def pool(files):
    times = {}
    for name in files:
        with open(name) as f:
            raw = json.load(f)
        for plane, by_size in raw.items():
            for size, sides in by_size.items():
                for side in ('old', 'new'):
                    times.setdefault((plane, size, side), []).extend(sides[side])
    print_table(times, f'pooled from {", ".join(files)}: us per op, one figure a run')


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--old')
    p.add_argument('--new')
    p.add_argument('--runs', type=int, default=5)
    p.add_argument('--sizes', default='4,4K,1M,64M')
    p.add_argument('--planes', default='shm,mpi,gloo,ucx')
    p.add_argument('--np', type=int, default=2)
    p.add_argument('--coll', default='allreduce')
    p.add_argument('--trials', type=int, default=3)
    p.add_argument('--iters', type=int, default=0, help='ops per loop (default 200, 20 from 16 MiB)')
    p.add_argument('--raw', help='also write every run\'s figure here (JSON: plane -> size -> old/new)')
    p.add_argument('--pool', nargs='+', metavar='RAW', help='print the table over these --raw files')
    p.add_argument('launcher', nargs='*')
    args = p.parse_args()
    if args.pool:
        pool(args.pool)
        return
    if not args.old or not args.new:
        p.error('--old and --new are required (or --pool)')
    launcher = args.launcher or default_launcher(args.np)
    sizes = [parse_size(s) for s in args.sizes.split(',')]
    planes = args.planes.split(',')
    times = {}  # (plane, size name, side) -> [us per run]
    for run in range(args.runs):
        sides = [('old', args.old), ('new', args.new)]
        if run % 2:
            sides.reverse()
        for side, build in sides:
            for plane in planes:
                for size in sizes:
                    iters = args.iters or (20 if size >= 16 << 20 else 200)
                    t = run_bench(launcher, build, args.coll, size, plane, iters, args.trials)
                    times.setdefault((plane, human(size), side), []).append(t)
        print(f'# run {run + 1} of {args.runs} done', file=sys.stderr, flush=True)
    if args.raw:
        raw = {}
        for (plane, size, side), values in times.items():
            raw.setdefault(plane, {}).setdefault(size, {})[side] = values
        with open(args.raw, 'w') as f:
            json.dump(raw, f, indent=1)
    ranks = f'{args.np} ranks' if not args.launcher else shlex.join(args.launcher)
    print_table(times, f'{args.coll}, {ranks}, hora out of place, us per op over {args.runs} runs '
                f'(each the median of {args.trials} loops); old: {args.old}, new: {args.new}')


if __name__ == '__main__':
    main()
