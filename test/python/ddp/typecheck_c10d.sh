#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Type-checks the "hora" torch backend's branches that this machine cannot build: CUDA tensors
# (HORA_TORCH_CUDA; Debian's torch has no libc10_cuda) and torch 2's c10d::Backend (only 1.13 is
# installed). Each source is compiled with -fsyntax-only by its command in compile_commands.json:
# process_group_hora.cpp with CUDA, and as torch 2 with CUDA (which covers torch 2 alone but for
# its #else branches); module.cpp as torch 2 with CUDA. torch 2 is faked by forcing
# TORCH_VERSION_MAJOR to 2 over 1.13's headers (which have a Backend.hpp); Debian's c10/cuda
# headers lack the generated cuda_cmake_macros.h, supplied here. Passing proves that the code
# type-checks against 1.13's declarations, not that it builds against a real torch 2 or CUDA torch.
#   test/python/ddp/typecheck_c10d.sh [BUILD_DIR (build)] [CUDA_PREFIX (/usr/local/cuda)]
set -eu
build=$(cd "${1:-build}" && pwd)
cuda=${2:-/usr/local/cuda}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/shim/c10/cuda/impl"
printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$scratch/shim/c10/cuda/impl/cuda_cmake_macros.h"
printf '#include <torch/csrc/api/include/torch/version.h>\n#undef TORCH_VERSION_MAJOR\n#define TORCH_VERSION_MAJOR 2\n' \
  > "$scratch/torch2.h"
cuda_flags="-DHORA_TORCH_CUDA=1 -I$cuda/include -I$scratch/shim"
status=0
for source in process_group_hora.cpp module.cpp; do
  # the compile command without its outputs (-MD ... -o X), as one line
  command=$(/usr/bin/python3 - "$build/compile_commands.json" "$source" <<'EOF'
import json, shlex, sys
entries = [e for e in json.load(open(sys.argv[1]))
           if e["file"].endswith("hora/distributed/" + sys.argv[2])]
if not entries:
    sys.exit("no compile command for %s: is the torch backend built?" % sys.argv[2])
args = shlex.split(entries[0]["command"])
out, skip = [], False
for a in args:
    if skip:
        skip = False
    elif a in ("-MD",):
        pass
    elif a in ("-MQ", "-MF", "-o"):
        skip = True
    else:
        out.append(a)
print(shlex.join(out))
EOF
)
  # As built is what ninja compiles; module.cpp's branches are few: its torch 2 + CUDA form alone.
  if [ "$source" = module.cpp ]; then
    variants="-include $scratch/torch2.h $cuda_flags"
  else
    variants="$cuda_flags
-include $scratch/torch2.h $cuda_flags"
  fi
  echo "$variants" | while IFS= read -r variant; do
    label="$source${variant:+ }$(echo "$variant" | sed "s#$scratch#SCRATCH#g")"
    if (cd "$build" && eval "$command -fsyntax-only $variant"); then
      echo "ok: $label"
    else
      echo "FAILED: $label"
      echo x >>"$scratch/failed"
    fi
  done
done
[ ! -s "$scratch/failed" ]
