#!/bin/bash
# Two builds side by side in each loadbench invocation (`daemon` and
# `daemon-b`), alternating which build is `daemon` from round to round.
#
# usage: benches/ab-builds.sh OUT ROUNDS DIR_A DIR_B [loadbench args...]
#   DIR_A, DIR_B: folders holding each build's ongrid-executor and
#   ongrid-skilld (cargo build --release --workspace --bins, copied);
#   loadbench itself is taken from DIR_A.
# Example:
#   benches/ab-builds.sh /tmp/ab.txt 4 /tmp/bin-new /tmp/bin-old \
#       --iters 1000 --warmup 50 --conc 1 --skills bin-cat,sh-cat
# Every process runs in the default scheduling policy, as the daemons do
# under systemd, unless SCHED=fifo: then in SCHED_FIFO 10 (`chrt -f 10`,
# less noise from the rest of the host; the A/Bs up to 2026-12-03 ran so,
# but a real-time executor does not spin for the exec and its skills leave
# the policy at exec).
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
out=$1 rounds=$2 a=$3 b=$4
shift 4
chrt=""
if [ "${SCHED:-other}" = fifo ]; then chrt="chrt -f 10"; fi
: > "$out"
for r in $(seq "$rounds"); do
    if [ $((r % 2)) = 1 ]; then x=$a y=$b; else x=$b y=$a; fi
    echo "== round $r: daemon=$x daemon-b=$y" >> "$out"
    $chrt "$a/loadbench" "$@" --variants bare,daemon,daemon-b \
        --bin-dir "$x" --bin-dir-b "$y" 2>&1 |
        grep -E '^skill |^(bare|daemon|daemon-b) +[0-9]|setup_us: mean|CPU per run|wake-ups' >> "$out" || true
done
cat "$out"
