#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hora-link on one host under horarun (two env:// ranks): the latency table has its four rows
# (one and two exchanges, asleep and spinning), each with positive figures; the bandwidth part
# says that nothing crosses a network; bad options are refused with the usage.
#   usage: link.sh LINK_PROGRAM HORARUN
set -euo pipefail
link=$1
horarun=$2
out=$(/usr/bin/python3 "$horarun" -np 2 "$link" --ops 50 2>&1) || { echo "$out"; exit 1; }
echo "$out"
rows=$(grep -E '^\[0\] +[12] +(sleep|spin) ' <<< "$out" | awk '{print $2, $3, $4, $5}')
[ "$(wc -l <<< "$rows")" -eq 4 ] || { echo "FAIL: expected 4 latency rows, got: $rows"; exit 1; }
awk '$3 <= 0 || $4 <= 0 {bad = 1} END {exit bad}' <<< "$rows" || { echo "FAIL: a figure not positive: $rows"; exit 1; }
grep -q '^\[0\] # bandwidth: every rank on one host' <<< "$out" || { echo "FAIL: no one-host bandwidth line"; exit 1; }
if bad=$(/usr/bin/python3 "$horarun" -np 2 "$link" --sizes 4,x 2>&1); then
  echo "FAIL: --sizes 4,x accepted"; exit 1
fi
grep -q 'hora-link: --sizes takes sizes' <<< "$bad" || { echo "FAIL: no reason for --sizes 4,x: $bad"; exit 1; }
echo "ok: hora-link on one host"
