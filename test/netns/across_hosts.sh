#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs a program on a cluster of namespace hosts: across_hosts.sh TOOL [hora-cluster
# options] PROGRAM. Exits 77 (skipped) where no cluster can be built (no root, no namespaces).
tool=$1
shift
if ! why=$("$tool" --check 2>&1); then
  echo "SKIP: $why"
  exit 77
fi
exec "$tool" "$@"
