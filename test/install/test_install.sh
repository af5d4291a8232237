#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# hora installed as a library (meson install into a staging folder): the tools carry the install
# prefix as their run path and run from there; examples and demos stay out of bin/; the
# gradient-step workloads are installed where hora-grads looks; an outside CMake project builds
# and runs against the package config (find_package(hora)).
#   test_install.sh BUILDDIR PREFIX LIBDIR
set -eu
build=$1
prefix=$2
libdir=$3
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

meson install -C "$build" --no-rebuild --quiet --destdir "$stage" >/dev/null
root=$stage$prefix
bin=$root/bin
lib=$root/$libdir

for tool in horarun hora-info hora-store; do
  [ -x "$bin/$tool" ] || fail "$tool is not installed in $prefix/bin"
done
for demo in hora-example hora-stall-demo; do
  [ ! -e "$bin/$demo" ] || fail "$demo (an example) was installed into bin/"
done
for tool in hora-info hora-store hora-bench hora-grads hora-link; do
  [ -e "$bin/$tool" ] || continue
  runpath=$(readelf -d "$bin/$tool" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
  case ":$runpath:" in
    *":$prefix/$libdir:"*) ;;
    *) fail "$tool's run path is '$runpath', not $prefix/$libdir" ;;
  esac
done
# horarun's program is a package it finds in ../share/hora from its own path, wherever that is.
[ -f "$root/share/hora/horarun_lib/cli.py" ] || fail "horarun's package is not in $prefix/share/hora/horarun_lib"
got=$(cd / && "$bin/horarun" --version) || fail "the installed horarun does not run"
case $got in "horarun (hora) "*) ;; *) fail "the installed horarun --version said '$got'" ;; esac
ln -s "$bin/horarun" "$stage/horarun-link"
got=$(cd / && "$stage/horarun-link" -np 2 --no-prefix /bin/echo rank) || fail "horarun through a symlink failed"
[ "$got" = "rank
rank" ] || fail "horarun through a symlink printed '$got'"
[ -f "$root/share/hora/resnet50_grads.txt" ] || fail "the gradient workloads are not in $prefix/share/hora"
[ -f "$lib/pkgconfig/hora.pc" ] || fail "no hora.pc in $libdir/pkgconfig"
[ -f "$lib/cmake/hora/horaConfig.cmake" ] || fail "no horaConfig.cmake in $libdir/cmake/hora"
[ -f "$lib/cmake/hora/horaConfigVersion.cmake" ] || fail "no horaConfigVersion.cmake"

# The staged tree is not at the prefix, so the run path cannot find the library there: name it.
version=$(LD_LIBRARY_PATH=$lib "$bin/hora-info" --version)
echo "$version"
case $version in "hora-info (hora) "*) ;; *) fail "hora-info --version said '$version'" ;; esac

if ! command -v cmake >/dev/null 2>&1; then
  echo "cmake not found: the find_package(hora) check is skipped"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
cmake -S "$here/consumer" -B "$stage/consumer" -DCMAKE_PREFIX_PATH="$root" >"$stage/cmake.log" 2>&1 ||
  { cat "$stage/cmake.log" >&2; fail "find_package(hora) failed"; }
# The version check: 1.0 (another major version) and 0.99 (newer than this one) are refused.
for want in 1.0 0.99; do
  if cmake -S "$here/consumer" -B "$stage/consumer-$want" -DCMAKE_PREFIX_PATH="$root" \
      -DHORA_WANT="$want" >"$stage/cmake-$want.log" 2>&1; then
    fail "find_package(hora $want) accepted $version"
  fi
  grep -q 'horaConfig.cmake, version: ' "$stage/cmake-$want.log" ||
    { cat "$stage/cmake-$want.log" >&2; fail "find_package(hora $want) failed without naming the version found"; }
done
cmake --build "$stage/consumer" >"$stage/build.log" 2>&1 ||
  { cat "$stage/build.log" >&2; fail "the consumer did not build against hora::hora"; }
env -u MASTER_ADDR -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_SIZE LD_LIBRARY_PATH="$lib" \
  HORA_BOOTSTRAP=single "$stage/consumer/hora_consumer"
echo "OK: installed tools, package config, an outside CMake build"
