#!/bin/sh
# The load measurements BENCHMARKS.md records. Run as root on an otherwise quiet machine.
#
#   benches/run.sh            # loadbench (the skills, sequential and 8 clients; warm runs)
#   benches/run.sh --micro    # also the criterion micro benches and the scan bench
#   ITERS=200 benches/run.sh  # shorter
#   SCHED=fifo benches/run.sh # every process in SCHED_FIFO 10 (chrt)
#
# By default every process runs in the default scheduling policy, as the
# daemons do under systemd. chrt -f 10 gives less noise, but the executor
# behaves differently in a real-time policy (no exec spin; its skills
# leave the policy at exec), so it is not the daemons' production behaviour.
#
# Installs bubblewrap and firejail with apt when missing (Debian/Ubuntu).
# The binaries are copied to a private directory first, so that a rebuild
# of the workspace during the run cannot swap them underneath.
set -eu

cd "$(dirname "$0")/.."
ITERS=${ITERS:-1000}
WARMUP=${WARMUP:-50}
OUT=${OUT:-target/loadbench-$(date +%Y%m%d-%H%M%S).txt}

if [ "$(id -u)" != 0 ]; then
    echo "run.sh: run as root (the executor's sandbox needs it)" >&2
    exit 2
fi
missing=""
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
command -v firejail >/dev/null 2>&1 || missing="$missing firejail"
if [ -n "$missing" ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi

cargo build --release --workspace --bins
BIN=$(mktemp -d /tmp/loadbench-bin.XXXXXX)
trap 'rm -rf "$BIN"' EXIT
cp target/release/ongrid-executor target/release/ongrid-skilld target/release/loadbench "$BIN"/

CHRT=""
if [ "${SCHED:-other}" = fifo ] && command -v chrt >/dev/null 2>&1; then CHRT="chrt -f 10"; fi
{
    echo "== $(uname -a)"
    echo "== $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)), $(grep MemTotal /proc/meminfo), $(rustc --version)"
    echo "== bwrap $(bwrap --version 2>/dev/null || echo missing), $(firejail --version 2>/dev/null | head -1 || echo firejail missing)"
    echo "== scheduling: ${CHRT:-default policy}"
    # shellcheck disable=SC2086
    $CHRT "$BIN"/loadbench --iters "$ITERS" --warmup "$WARMUP" --bin-dir "$BIN"
    # The latency decomposition of the daemon path (not in the default set).
    # shellcheck disable=SC2086
    $CHRT "$BIN"/loadbench --iters "$ITERS" --warmup "$WARMUP" --bin-dir "$BIN" --conc 1 \
        --skills bin-cat --variants bare,engine,executor-rpc,daemon-shm,daemon
    # The boxes' own cost, with a skill whose start-up costs next to nothing
    # (no C library, so none of glibc's cpuid probing, which traps to the
    # hypervisor in a guest).
    # shellcheck disable=SC2086
    $CHRT "$BIN"/loadbench --iters "$ITERS" --warmup "$WARMUP" --bin-dir "$BIN" \
        --skills static-cat --variants bare,engine,executor-rpc,daemon,bwrap,firejail
    # Warm runs: against a bare spawn and a process started ahead with no
    # box (the floor); 8 clients back to back, then paced (20 ms between
    # each client's runs, jittered) so that the pools refill in idle time.
    if [ -x /usr/bin/python3 ]; then WARM_SKILLS=py-json,bin-cat,sh-cat; else WARM_SKILLS=bin-cat,sh-cat; fi
    # shellcheck disable=SC2086
    $CHRT "$BIN"/loadbench --iters 300 --warmup 20 --bin-dir "$BIN" --conc 1 --warm 8 \
        --skills "$WARM_SKILLS" --variants bare,bare-warm,daemon,daemon-warm
    # shellcheck disable=SC2086
    $CHRT "$BIN"/loadbench --iters 100 --warmup 10 --bin-dir "$BIN" --conc 8 --warm 8 \
        --skills "$WARM_SKILLS" --variants bare,daemon,daemon-warm
    # shellcheck disable=SC2086
    $CHRT "$BIN"/loadbench --iters 200 --warmup 10 --bin-dir "$BIN" --conc 8 --warm 8 --gap-ms 20 \
        --skills bin-cat,sh-cat --variants bare,daemon,daemon-warm
} 2>&1 | tee "$OUT"

if [ "${1:-}" = "--micro" ]; then
    cargo bench -p ongrid-benches --bench micro 2>&1 | tee -a "$OUT"
    cargo bench -p ongrid-benches --bench scan 2>&1 | tee -a "$OUT"
fi
echo "run.sh: written to $OUT"
