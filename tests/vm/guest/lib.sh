# Helpers of the guest checks (sourced by main.sh; bash).
#
# A check is a function that returns 0 when it holds, or calls `why
# REASON` and returns non-zero; `check NAME FUNCTION [ARGS...]` runs it and
# records the line. Diagnostics go to stdout (out/guest.log).

SKILLD_SOCK=/run/ongrid/skilld.sock
EXAMPLES="echo host_load disk_usage tail_file probe_tcp probe_http probe_dns"

log() { echo "$(date +%T) $*"; }

# console TEXT: progress on the serial console (the host keeps it).
console() { echo "ongrid-vm: $*" > /dev/ttyS0 2>/dev/null || true; }

# why REASON: the reason the running check fails (the first one given wins).
why() {
    [ -s "$work/why" ] || printf '%s' "$*" | tr '\n' ' ' > "$work/why"
    log "why: $*"
    return 1
}

# info NAME TEXT: a recorded value, not a check.
info() {
    echo "INFO $1: $2" >> "$results"
    log "INFO $1: $2"
}

check() {
    local name=$1 started=$SECONDS
    shift
    # ONGRID_VM_CHECKS on the host: only the checks it names run.
    if [ -s "$share/only" ] && ! grep -qx "$name" "$share/only"; then
        return 0
    fi
    rm -f "$work/why"
    log "== check $name"
    if "$@"; then
        echo "PASS $name" >> "$results"
        console "PASS $name"
        log "PASS $name ($((SECONDS - started))s)"
        return 0
    fi
    local reason
    reason=$(cat "$work/why" 2>/dev/null)
    echo "FAIL $name: ${reason:-failed (see guest.log)}" >> "$results"
    console "FAIL $name"
    log "FAIL $name: ${reason:-failed} ($((SECONDS - started))s)"
    return 1
}

finish() {
    log "== journal of the units (last 200 lines)"
    journalctl -u ongrid-executor -u ongrid-skilld -u ongrid-executor.socket \
        -u ongrid-skilld.socket --no-pager -n 200 -o short-precise 2>&1
    echo "ongrid-vm: checks finished" >> "$results"
    sync
}

# The kernel's Landlock ABI (0: none), as landlock_create_ruleset(2) with
# LANDLOCK_CREATE_RULESET_VERSION reports it.
landlock_abi() {
    python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
v = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
print(max(v, 0))'
}

# json FILE EXPR: evaluates a Python expression over the JSON in FILE (as
# `r`); prints the value, exits non-zero when it is false or FILE is not
# JSON.
json() {
    python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"not JSON: {e}")
    sys.exit(2)
v = eval(sys.argv[2], {"r": r})
print(v if isinstance(v, str) else json.dumps(v))
sys.exit(0 if v else 1)
PY
}

# api_run SKILL ARGS OUT: POST /v1/skills/SKILL/execute, the report to OUT.
api_run() {
    curl -sS --max-time 180 --unix-socket "$SKILLD_SOCK" \
        -H 'Content-Type: application/json' -d "{\"args\":$2}" \
        "http://localhost/v1/skills/$1/execute" > "$3"
}

# cli_run SKILL ARGS OUT: ongrid-skill run --json, as a member of group
# ongrid (the API clients' group), the report to OUT.
cli_run() {
    setpriv --reuid=ongrid-vm-client --regid=ongrid-vm-client --init-groups \
        ongrid-skill run "$1" --args "$2" --json > "$3"
}

# outcome FILE: the report's outcome (or "none").
outcome() {
    python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1])).get("outcome", "none"))
except Exception: print("none")' "$1"
}

# wait_active UNIT SECONDS
wait_active() {
    local i
    for ((i = 0; i < $2 * 2; i++)); do
        [ "$(systemctl is-active "$1")" = active ] && return 0
        sleep 0.5
    done
    return 1
}

# main_pid UNIT: systemd's MainPID (0 when not running).
main_pid() { systemctl show -p MainPID --value "$1"; }

# wait_new_pid UNIT OLD SECONDS: the unit runs again with a MainPID other
# than OLD.
wait_new_pid() {
    local i pid
    for ((i = 0; i < $3 * 2; i++)); do
        pid=$(main_pid "$1")
        if [ "$pid" != 0 ] && [ "$pid" != "$2" ] && [ "$(systemctl is-active "$1")" = active ]; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

# add_pack NAME ENTRY_FILE MANIFEST_JSON: a test pack under
# /etc/ongrid/skills (root-owned, 0755, as the README asks).
add_pack() {
    install -d -m 0755 "/etc/ongrid/skills/$1"
    install -m 0755 "$2" "/etc/ongrid/skills/$1/${2##*/}"
    printf '%s\n' "$3" > "/etc/ongrid/skills/$1/skill.json"
    chmod 0644 "/etc/ongrid/skills/$1/skill.json"
}
