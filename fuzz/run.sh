#!/usr/bin/env bash
# Runs every cargo-fuzz target (or the ones named) for SECONDS each, one
# after the other, and prints a table of runs, execs/s, peak RSS and
# coverage. Exits 1 if any target found a crash, a timeout (one input over
# 10 s) or an out-of-memory (2 GiB); its input is left in
# fuzz/artifacts/TARGET/ (turn it into a regression test, see docs/reliability.md).
#
#   fuzz/run.sh [SECONDS] [TARGET...]     SECONDS defaults to 300
#
# Needs cargo-fuzz (.ci/fuzz installs the pinned version) and a C++
# compiler (libfuzzer-sys builds libFuzzer). Only stable Rust is needed:
# RUSTC_BOOTSTRAP=1 lets it take the -Z flags cargo-fuzz passes.
# FUZZ_SANITIZER=none|address (default address) picks the sanitizer.
# Corpora grow in fuzz/corpus/TARGET (not committed); the hand-written
# seeds in fuzz/seeds/TARGET are read as well. Logs: fuzz/artifacts/logs/.
set -euo pipefail
cd "$(dirname "$0")"

secs=${1:-300}
shift || true
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR=never
sanitizer=${FUZZ_SANITIZER:-address}

if (($#)); then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

echo "== cargo fuzz build (sanitizer: $sanitizer)"
cargo fuzz build -O --sanitizer "$sanitizer"

mkdir -p artifacts/logs
failed=()
rows=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    dirs=("corpus/$t")
    [[ -d "seeds/$t" ]] && dirs+=("seeds/$t")
    args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
    [[ -f "dict/$t.dict" ]] && args+=(-dict="dict/$t.dict")
    # A structured input (arbitrary::Unstructured) needs its bytes at once,
    # not libFuzzer's slow growth of the input length from 4 bytes.
    [[ "$t" == http_request ]] && args+=(-len_control=0)
    log="artifacts/logs/$t.log"
    echo "== fuzz $t for ${secs}s"
    start=$(date +%s)
    if cargo fuzz run -O --sanitizer "$sanitizer" "$t" "${dirs[@]}" -- "${args[@]}" >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed+=("$t")
        grep -E -A2 "ERROR: libFuzzer|panicked at|Test unit written|Base64:" "$log" | head -40 || true
    fi
    took=$(($(date +%s) - start))
    stat() { grep -m1 "^stat::$1:" "$log" | awk '{print $2}'; }
    runs=$(stat number_of_executed_units)
    eps=$(stat average_exec_per_sec)
    rss=$(stat peak_rss_mb)
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    corpus=$(find "corpus/$t" -type f | wc -l)
    rows+=("$(printf '%-14s %-7s %8ss %12s %10s %8s %8s %8s' "$t" "$status" "$took" "${runs:-?}" "${eps:-?}" "${rss:-?}" "${cov:-?}" "$corpus")")
done

echo
printf '%-14s %-7s %9s %12s %10s %8s %8s %8s\n' target status time runs execs/s rss_mb cov corpus
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
    echo "fuzz: FAILED: ${failed[*]} (inputs in fuzz/artifacts/, logs in fuzz/artifacts/logs/)" >&2
    exit 1
fi
