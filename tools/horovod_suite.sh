#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs Horovod's own PyTorch test suite (test/parallel/test_torch.py of a Horovod checkout you
# provide) against hora.torch, unmodified: a throw-away package makes `import horovod.torch`
# import hora.torch, and a few lines stand in for the helpers the suite imports from Horovod's
# test utilities. Nothing of Horovod's is copied into hora.
#
#   tools/horovod_suite.sh HOROVOD_CHECKOUT [BUILD_DIR] [NP] [MODE]
#
# MODE: each (default): every test case alone under mpirun (a failure cannot spill into the next
#       case; each capped at HORA_SUITE_CASE_S, default 90 s, so a hang shows as HANG);
#       gloo: the whole file in one horarun job with HOROVOD_RANK set, as Horovod's Gloo mode
#       runs it (init and shutdown around every case, which also covers the re-init cases).
# Prints one line per case (each mode) or pytest's summary (gloo), then the totals.
set -u
HVD=${1:?usage: tools/horovod_suite.sh HOROVOD_CHECKOUT [BUILD_DIR] [NP] [each|gloo]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${2:-$ROOT/build}" && pwd)
NP=${3:-2}
MODE=${4:-each}
PYTHON=/usr/bin/python3
SUITE=$HVD/test/parallel/test_torch.py
[ -f "$SUITE" ] || { echo "horovod_suite: no $SUITE" >&2; exit 2; }
[ -d "$BUILD/bindings/python/hora" ] || { echo "horovod_suite: $BUILD has no Python package (build with -Dpython=enabled)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/hora-horovod-suite.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/horovod/torch" "$WORK/logs"
cp "$SUITE" "$WORK/test_torch.py"
: > "$WORK/horovod/__init__.py"
cat > "$WORK/horovod/torch/__init__.py" <<'EOF'
import sys
import hora.torch
sys.modules[__name__] = hora.torch
EOF
# what test_torch.py imports from Horovod's test/utils/common.py
cat > "$WORK/common.py" <<'EOF'
import contextlib, os, shutil, tempfile

def mpi_env_rank_and_size():
    for r, s in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("RANK", "WORLD_SIZE")):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1

def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    test.skipTest(message)

@contextlib.contextmanager
def temppath():
    d = tempfile.mkdtemp()
    try:
        yield os.path.join(d, "temp_test_file")
    finally:
        shutil.rmtree(d, ignore_errors=True)
EOF
export PYTHONPATH=$WORK:$BUILD/bindings/python
export HORA_STALL_SHUTDOWN_S=${HORA_STALL_SHUTDOWN_S:-30}
cd "$WORK"
PYTEST=(-m pytest -p no:cacheprovider -q -rA --color=no test_torch.py)

if [ "$MODE" = gloo ]; then
  cat > "$WORK/gloo_rank.sh" <<EOF
#!/bin/bash
export HOROVOD_RANK=\$RANK HOROVOD_SIZE=\$WORLD_SIZE
exec $PYTHON ${PYTEST[*]}
EOF
  chmod +x "$WORK/gloo_rank.sh"
  timeout -k 10 "${HORA_SUITE_TOTAL_S:-900}" "$PYTHON" "$ROOT/tools/horarun" -np "$NP" \
    "$WORK/gloo_rank.sh" 2>&1 | grep -E "^\[[0-9]+\] (FAILED|ERROR|.*[0-9]+ (passed|failed))"
  exit "${PIPESTATUS[0]}"
fi

source "$ROOT/tools/mpirun_flags.sh"
pass=0; fail=0; skip=0; hang=0
for t in $("$PYTHON" -c "import re,sys; print('\n'.join(re.findall(r'^    def (test_\w+)\(', open(sys.argv[1]).read(), re.M)))" test_torch.py); do
  log=$WORK/logs/$t.log
  timeout -k 5 "${HORA_SUITE_CASE_S:-90}" mpirun "${HORA_MPIRUN_ARGS[@]}" -np "$NP" \
    "$PYTHON" "${PYTEST[@]}" -k "$t and not ${t}_" > "$log" 2>&1 < /dev/null
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then r=HANG; hang=$((hang + 1))
  elif [ $rc = 0 ] && grep -q "^SKIPPED" "$log" && ! grep -q "^PASSED" "$log"; then r=SKIP; skip=$((skip + 1))
  elif [ $rc = 0 ]; then r=PASS; pass=$((pass + 1))
  else r=FAIL; fail=$((fail + 1)); fi
  echo "$r $t"
  if [ $r = FAIL ]; then grep -E "^E " "$log" | head -3 | sed 's/^/    /'; fi
done
echo "horovod_suite: $NP ranks: $pass passed, $fail failed, $skip skipped, $hang hung"
[ $fail = 0 ] && [ $hang = 0 ]
