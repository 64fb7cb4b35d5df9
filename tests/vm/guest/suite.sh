# Guest check: the sandbox suite's own binary, built on the host, run
# inside the guest against the installed executor, one-shot and served
# (sourced by main.sh).
#
# tests/vm/run puts the suite's test binary, the in-box attack binary and
# the absolute path the suite was built to find the attack binary at on
# the exchange disk (suite/), with the cases to run (suite/filters, libtest
# filters), and how many times to run them in a row (suite/rounds: a
# failure seen once in a while shows up more often). The binaries are
# built against the host's C library (Debian 12), which both guests' are
# at least.

check_sandbox_suite() { # oneshot|serve
    local mode=$1 dir=$share/suite
    [ -f "$dir/sandbox" ] && [ -f "$dir/attack" ] && [ -f "$dir/attack-path" ] ||
        { why "no sandbox suite on the exchange disk (tests/vm/run found no built suite: run scripts/test first)"; return 1; }
    local attack_path bin=/root/ongrid-sandbox-suite filters=()
    attack_path=$(cat "$dir/attack-path")
    mkdir -p "$(dirname "$attack_path")"
    install -m 0755 "$dir/attack" "$attack_path"
    install -m 0755 "$dir/sandbox" "$bin"
    read -r -a filters < "$dir/filters"
    local log=$work/suite-$mode.log rc=0 executor=/usr/bin/ongrid-executor
    if [ -f "$dir/executor" ]; then
        executor=/root/ongrid-executor-under-test
        install -m 0755 "$dir/executor" "$executor"
    fi
    # A crash leaves its core in out/ (read back with the host's binary).
    echo "$out/core.%e.%p" > /proc/sys/kernel/core_pattern
    local cores_before round rounds=1
    cores_before=$(find "$out" -maxdepth 1 -name 'core.*' | wc -l)
    [ -f "$dir/rounds" ] && rounds=$(cat "$dir/rounds")
    : > "$log"
    for ((round = 1; round <= rounds; round++)); do
        (ulimit -c unlimited; cd /tmp && ONGRID_EXECUTOR=$executor ONGRID_SANDBOX_VIA=$mode \
            timeout 1200 "$bin" "${filters[@]}") >> "$log" 2>&1 || rc=$?
    done
    cat "$log"
    local summary cores
    summary=$(grep '^test result:' "$log" | tail -n 1)
    cores=$(($(find "$out" -maxdepth 1 -name 'core.*' | wc -l) - cores_before))
    ((rounds == 1)) || summary="$rounds rounds, $(grep -c '^test result: ok' "$log") passed; last: $summary"
    info "sandbox-suite-$mode" "${summary:-no summary} (filters: ${filters[*]}; $(grep -c '^SKIP' "$log") skip lines; $cores core dumps)"
    [ "$rc" = 0 ] ||
        why "exited $rc: $(grep -E '^test .* FAILED$|panicked at' "$log" | head -n 6 | paste -sd' ')"
    ! grep -q '^test result: FAILED' "$log" && grep -q '^test result: ok' "$log" ||
        why "no passing summary"
    [ ! -s "$work/why" ]
}
