# Guest checks: the daemons under systemd: killed mid-run and restarted,
# stopped with runs in flight, hardening scores, journal priorities
# (sourced by main.sh).

# wait_sleeping SECONDS: a sleeper run's process is up.
wait_sleeping() {
    local i
    for ((i = 0; i < $1 * 4; i++)); do
        pgrep -u ongrid-skill -f sleeper >/dev/null && return 0
        sleep 0.25
    done
    return 1
}

# wait_no_sleeper SECONDS: no process of the run-as user is left.
wait_no_sleeper() {
    local i
    for ((i = 0; i < $1 * 4; i++)); do
        pgrep -u ongrid-skill >/dev/null || return 0
        sleep 0.25
    done
    return 1
}

# kill_mid_run UNIT: SIGKILL to the unit (systemctl kill, every process of
# it) while a run is in flight; the run ends, systemd restarts the unit,
# skilld (re)connects and the next run succeeds.
kill_mid_run() {
    local unit=$1 old runner
    old=$(main_pid "$unit")
    api_run sleeper '{"seconds":30}' "$work/kill-$unit.json" &
    runner=$!
    wait_sleeping 20 || { wait "$runner"; why "the sleeper run did not start"; return 1; }
    systemctl kill -s SIGKILL "$unit"
    local start=$SECONDS
    wait "$runner"
    info "kill-$unit" "the client saw after $((SECONDS - start))s: $(head -c 300 "$work/kill-$unit.json" | tr '\n' ' ')"
    [ "$(outcome "$work/kill-$unit.json")" != ok ] || why "the run ended ok although its $unit was killed"
    wait_no_sleeper 15 || why "the run outlived the kill: $(pgrep -u ongrid-skill -a | head -n 3 | paste -sd' ')"
    wait_new_pid "$unit" "$old" 30 ||
        { why "$unit not restarted: $(systemctl is-active "$unit"), MainPID $(main_pid "$unit")"; return 1; }
    info "restart-$unit" "MainPID $old -> $(main_pid "$unit"), NRestarts $(systemctl show -p NRestarts --value "$unit")"
    api_run echo '{"message":"after the kill"}' "$work/after-kill-$unit.json"
    [ "$(outcome "$work/after-kill-$unit.json")" = ok ] ||
        why "the next run after killing $unit: $(head -c 300 "$work/after-kill-$unit.json")"
    [ ! -s "$work/why" ]
}

check_kill_executor() { kill_mid_run ongrid-executor.service; }
check_kill_skilld() { kill_mid_run ongrid-skilld.service; }

# systemctl stop with a run in flight: the run finishes (the drain), the
# stop ends well within TimeoutStopSec (90 s) and both units end cleanly.
check_stop_drains() {
    local runner start took u
    api_run sleeper '{"seconds":8}' "$work/drain.json" &
    runner=$!
    wait_sleeping 20 || { wait "$runner"; why "the sleeper run did not start"; return 1; }
    start=$SECONDS
    systemctl stop ongrid-skilld.service ongrid-executor.service
    took=$((SECONDS - start))
    wait "$runner"
    info stop-drain "stop took ${took}s with an 8 s run in flight; the run: $(outcome "$work/drain.json")"
    [ "$(outcome "$work/drain.json")" = ok ] || why "the run in flight did not finish: $(head -c 300 "$work/drain.json")"
    ((took < 90)) || why "stop took ${took}s"
    for u in ongrid-skilld.service ongrid-executor.service; do
        [ "$(systemctl show -p Result --value "$u")" = success ] ||
            why "$u Result=$(systemctl show -p Result --value "$u")"
    done
    systemctl start ongrid-executor.service ongrid-skilld.service || why "start after stop failed"
    [ ! -s "$work/why" ]
}

# systemd-analyze security on the running units; the bounds are the
# offline scores .ci/package holds the units to.
check_security_scores() {
    local spec unit bound score
    for spec in ongrid-executor:2.5 ongrid-skilld:1.8; do
        unit=${spec%%:*} bound=${spec##*:}
        systemd-analyze security --no-pager "$unit.service" > "$work/security-$unit.txt" 2>&1
        score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$work/security-$unit.txt")
        info "security-$unit" "exposure ${score:-?} (offline bound $bound)"
        [ -n "$score" ] || { why "no score for $unit: $(tail -n 2 "$work/security-$unit.txt")"; continue; }
        awk -v s="$score" -v b="$bound" 'BEGIN { exit !(s <= b) }' || why "$unit exposure $score > $bound"
    done
    [ ! -s "$work/why" ]
}

# The daemons' lines reach the journal with their own priorities (the
# `<N>` prefix parsed, not shown), not all at the stream's default.
check_journal_priorities() {
    journalctl -u ongrid-executor.service -u ongrid-skilld.service -o json --no-pager > "$work/journal.json"
    python3 - "$work/journal.json" > "$work/journal-check.txt" <<'PY'
import collections, json, re, sys
by = collections.defaultdict(collections.Counter)
raw = []
for line in open(sys.argv[1]):
    e = json.loads(line)
    comm = e.get("_COMM", "")
    if not comm.startswith("ongrid-"):
        continue
    msg = e.get("MESSAGE", "")
    if isinstance(msg, list):
        msg = bytes(msg).decode(errors="replace")
    by[comm][e.get("PRIORITY")] += 1
    if re.match(r"^<\d>", msg):
        raw.append(msg[:120])
for comm, c in sorted(by.items()):
    print(comm, dict(sorted(c.items())))
for m in raw[:3]:
    print("RAW", m)
PY
    cat "$work/journal-check.txt"
    info journal "$(grep -v '^RAW' "$work/journal-check.txt" | paste -sd';')"
    grep -q '^RAW' "$work/journal-check.txt" && why "lines with an unparsed <N> prefix: $(grep -m1 '^RAW' "$work/journal-check.txt")"
    local d
    for d in ongrid-executor ongrid-skilld; do
        grep -q "^$d " "$work/journal-check.txt" || why "no journal lines from $d"
    done
    # At least two distinct priorities overall (info and a warning or worse).
    python3 - "$work/journal.json" <<'PY' || why "every daemon line has one priority"
import json, sys
p = {json.loads(l).get("PRIORITY") for l in open(sys.argv[1]) if json.loads(l).get("_COMM", "").startswith("ongrid-")}
sys.exit(0 if len(p) >= 2 else 1)
PY
    [ ! -s "$work/why" ]
}

check_no_failed_units() {
    local failed
    failed=$(systemctl list-units --failed --no-legend --plain | awk '{ print $1 }' | paste -sd' ')
    [ -z "$failed" ] || why "failed units: $failed"
}
