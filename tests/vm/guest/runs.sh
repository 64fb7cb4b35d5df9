# Guest checks: the example skills through the API and the CLI, what the
# report's `sandbox` says under the real unit, and hostile skills stopped by
# the limits (sourced by main.sh).

# Loopback services for the probes (the guest has no other network): an
# HTTP server on 127.0.0.1:18080 and a DNS responder on 127.0.0.1:18053
# answering every A query with 192.0.2.7.
start_listeners() {
    [ -f "$work/listeners.pid" ] && kill -0 "$(cat "$work/listeners.pid")" 2>/dev/null && return 0
    python3 - > "$work/listeners.log" 2>&1 <<'PY' &
import http.server, socket, threading

def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 18053))
    while True:
        q, peer = s.recvfrom(512)
        resp = bytes([q[0], q[1], 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]) + q[12:]
        resp += bytes([0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 7])
        s.sendto(resp, peer)

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the vm"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

threading.Thread(target=dns, daemon=True).start()
http.server.HTTPServer(("127.0.0.1", 18080), Hello).serve_forever()
PY
    echo $! > "$work/listeners.pid"
    sleep 1
}

# example_args SKILL: the arguments each example runs with here.
example_args() {
    case $1 in
        echo) echo '{"message":"from the vm"}' ;;
        host_load) echo '{}' ;;
        disk_usage) echo '{"mount_prefix":"/"}' ;;
        tail_file) echo '{"path":"/var/log/ongrid-vm/app.log","lines":2}' ;;
        probe_tcp) echo '{"host":"127.0.0.1","port":18080}' ;;
        probe_http) echo '{"url":"http://127.0.0.1:18080/","body_bytes":5}' ;;
        probe_dns) echo '{"name":"db.example.test","server":"127.0.0.1","port":18053}' ;;
    esac
}

# example_expect SKILL: a Python expression over the report `r` that holds
# when the skill did its job.
example_expect() {
    case $1 in
        echo) echo 'r["result"] == {"message": "from the vm"}' ;;
        host_load) echo '{"load1", "load5", "load15"} <= set(r["result"])' ;;
        disk_usage) echo 'any(f["mount"] == "/" for f in r["result"]["filesystems"])' ;;
        tail_file) echo 'r["result"]["lines"] == ["two", "three"]' ;;
        probe_tcp) echo 'r["result"]["reachable"] is True' ;;
        probe_http) echo 'r["result"]["status"] == 200 and r["result"]["body"] == "hello"' ;;
        probe_dns) echo 'r["result"]["rcode"] == "NOERROR" and r["result"]["answers"][0]["data"] == "192.0.2.7"' ;;
    esac
}

check_example_report() { # SKILL FILE HOW
    local got
    got=$(json "$2" 'r.get("outcome")')
    [ "$got" = ok ] || { why "$3: outcome $got: $(head -c 400 "$2")"; return 1; }
    json "$2" "$(example_expect "$1")" >/dev/null ||
        { why "$3: unexpected result: $(head -c 400 "$2")"; return 1; }
}

check_run_api() {
    start_listeners
    api_run "$1" "$(example_args "$1")" "$work/api-$1.json" || { why "curl failed"; return 1; }
    cat "$work/api-$1.json"; echo
    check_example_report "$1" "$work/api-$1.json" API
}

check_run_cli() {
    start_listeners
    cli_run "$1" "$(example_args "$1")" "$work/cli-$1.json" ||
        { why "ongrid-skill run $1 exited non-zero: $(head -c 400 "$work/cli-$1.json")"; return 1; }
    cat "$work/cli-$1.json"; echo
    check_example_report "$1" "$work/cli-$1.json" CLI
}

# The report says cgroup v2 held the run, and the run's cgroup, seen from
# outside while it runs, has the configured memory.max and pids.max.
check_sandbox_cgroup_v2() {
    local report=$work/api-host_load.json
    json "$report" 'r["sandbox"]["cgroup"] == {"kill": "v2", "memory": "v2", "pids": "v2"}' >/dev/null ||
        { why "sandbox.cgroup is $(json "$report" 'r["sandbox"]["cgroup"]')"; return 1; }
    json "$report" '[d for d in r["sandbox"]["degraded"] if "cgroup" in d or "memory" in d or "pids" in d]' \
        >/dev/null && { why "degraded names cgroups: $(json "$report" 'r["sandbox"]["degraded"]')"; return 1; }
    api_run sleeper '{"seconds":6}' "$work/sleeper-cg.json" &
    local runner=$! i dir="" base=/sys/fs/cgroup/system.slice/ongrid-executor.service
    for ((i = 0; i < 40; i++)); do
        dir=$(find "$base" -mindepth 2 -name pids.max -exec grep -lvx max {} + 2>/dev/null | head -n 1)
        [ -n "$dir" ] && break
        sleep 0.25
    done
    dir=${dir%/pids.max}
    if [ -z "$dir" ]; then
        wait "$runner"
        why "no run cgroup with a pids.max under $base: $(find "$base" -maxdepth 3 -type d | paste -sd' ')"
        return 1
    fi
    info run-cgroup "${dir#/sys/fs/cgroup/}: memory.max $(cat "$dir/memory.max"), pids.max $(cat "$dir/pids.max"), memory.swap.max $(cat "$dir/memory.swap.max" 2>/dev/null)"
    [ "$(cat "$dir/memory.max")" = 536870912 ] || why "memory.max is $(cat "$dir/memory.max"), expected 536870912"
    [ "$(cat "$dir/pids.max")" = 64 ] || why "pids.max is $(cat "$dir/pids.max"), expected 64"
    wait "$runner"
    [ "$(outcome "$work/sleeper-cg.json")" = ok ] || why "sleeper run: $(head -c 300 "$work/sleeper-cg.json")"
    [ ! -s "$work/why" ]
}

# `degraded` names exactly what the kernel's Landlock ABI lacks: nothing
# at the ABI the executor wants in full, else the missing rights.
check_landlock_degraded() {
    local report=$work/api-host_load.json abi
    abi=$(landlock_abi)
    json "$report" 'r["sandbox"]["landlock"]' | sed 's/^/landlock: /'
    json "$report" 'r["sandbox"]["degraded"]' | sed 's/^/degraded: /'
    info landlock "kernel ABI $abi; report $(json "$report" 'r["sandbox"]["landlock"]'); degraded $(json "$report" 'r["sandbox"]["degraded"]')"
    [ "$(json "$report" 'r["sandbox"]["landlock"]["abi"]')" = "$abi" ] ||
        { why "report ABI $(json "$report" 'r["sandbox"]["landlock"]["abi"]'), kernel $abi"; return 1; }
    local full lines
    full=$(json "$report" 'r["sandbox"]["landlock"]["status"] == "full"')
    lines=$(json "$report" '[d for d in r["sandbox"]["degraded"] if d.startswith("landlock")]')
    if [ "$full" = true ]; then
        [ "$lines" = "[]" ] || why "status full but degraded says $lines"
    else
        grep -q "kernel ABI $abi <" <<<"$lines" || why "status $(json "$report" 'r["sandbox"]["landlock"]["status"]') at ABI $abi, degraded: $lines"
        # ABI 2 lacks truncate (3), TCP rules (4), ioctl on devices (5) and
        # scoping (6): each must be named.
        if [ "$abi" -le 2 ]; then
            local want
            for want in truncate; do
                grep -qi "$want" <<<"$lines" || why "degraded at ABI $abi does not name $want: $lines"
            done
        fi
    fi
    [ ! -s "$work/why" ]
}

# A skill asking for network with no grant is rejected before it runs.
check_ungranted_network() {
    api_run netask '{}' "$work/netask.json"
    cat "$work/netask.json"; echo
    [ "$(outcome "$work/netask.json")" = rejected ] || { why "outcome $(outcome "$work/netask.json")"; return 1; }
    json "$work/netask.json" '"network" in r["error"]' >/dev/null || why "error does not name network: $(json "$work/netask.json" 'r["error"]')"
}

# The egress allowlist under the real unit: probe_tcp's grant names
# 127.0.0.1:18080 only, so a connect to 18081 is refused in the kernel at
# once, and the report and the audit row count it.
check_egress_refused() {
    start_listeners
    api_run probe_tcp '{"host":"127.0.0.1","port":18081}' "$work/egress-refused.json"
    cat "$work/egress-refused.json"; echo
    local net
    net=$(json "$work/egress-refused.json" 'r["sandbox"]["network"]')
    info egress "$net"
    json "$work/egress-refused.json" 'r["result"]["reachable"] is False' >/dev/null ||
        { why "probe_tcp to an ungranted port: $(head -c 400 "$work/egress-refused.json")"; return 1; }
    json "$work/egress-refused.json" \
        'any(d["destination"] == "127.0.0.1:18081" and d["protocol"] == "tcp" for d in r["sandbox"]["network"]["denied"])' \
        >/dev/null || why "denied does not list 127.0.0.1:18081: $net"
    json "$work/egress-refused.json" 'r["sandbox"]["network"]["enforced"] == ["127.0.0.1:18080"]' >/dev/null ||
        why "enforced is not the grant's list: $net"
    curl -sS --max-time 30 --unix-socket "$SKILLD_SOCK" \
        'http://localhost/v1/audit?skill=probe_tcp&limit=1' > "$work/egress-audit.json"
    json "$work/egress-audit.json" 'r["items"][0]["network_denied"] >= 1' >/dev/null ||
        why "the audit row keeps no refusal count: $(head -c 300 "$work/egress-audit.json")"
    [ ! -s "$work/why" ]
}

# The hostile packs (and a sleeper used by the lifecycle checks).
install_test_packs() {
    [ -d /etc/ongrid/skills/sleeper ] && return 0
    local d=$work/packs
    mkdir -p "$d"
    cat > "$d/sleeper.sh" <<'SH'
#!/bin/sh
# Sleeps args.seconds, then prints {"slept": N}.
args=$(/bin/cat)
s=$(printf '%s' "$args" | /bin/sed -n 's/.*"seconds"[^0-9]*\([0-9]*\).*/\1/p')
/bin/sleep "${s:-1}"
echo "{\"slept\": ${s:-1}}"
SH
    cat > "$d/forkbomb.sh" <<'SH'
#!/bin/sh
# Forks without end; the pids bound and the timeout stop it.
f() { f | f & }
f
/bin/sleep 60
SH
    cat > "$d/memhog.py" <<'PY'
#!/usr/bin/python3
# Allocates and touches 32 MiB blocks until stopped.
keep = []
while True:
    keep.append(bytearray(32 << 20))
PY
    cat > "$d/diskfill.py" <<'PY'
#!/usr/bin/python3
# Writes 1 MiB files into its run directory until a write fails (or 4 GiB).
import json, os
total, err = 0, None
buf = b"d" * (1 << 20)
try:
    for i in range(4096):
        with open(f"fill-{i}", "wb") as f:
            f.write(buf)
        total += 1
except OSError as e:
    err = os.strerror(e.errno)
print(json.dumps({"mib": total, "error": err, "dir": os.getcwd()}))
PY
    cat > "$d/psview.py" <<'PY'
#!/usr/bin/python3
# What this run sees of the processes: the pids /proc lists (with one
# child alive), and whether PID 1's command line reads.
import json, os, subprocess
child = subprocess.Popen(["/bin/sleep", "30"])
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
try:
    with open("/proc/1/cmdline", "rb") as f:
        init = f.read() != b""
except OSError:
    init = False
child.kill()
child.wait()
print(json.dumps({"pids": pids, "me": os.getpid(), "child": child.pid, "init_cmdline": init}))
PY
    cat > "$d/warmprobe.py" <<'PY'
#!/usr/bin/python3
# Reads its args, then prints its own scheduling policy and nice value.
import json, os, sys
json.load(sys.stdin)
print(json.dumps({"policy": os.sched_getscheduler(0), "nice": os.getpriority(os.PRIO_PROCESS, 0)}))
PY
    printf '#!/bin/sh\necho "{}"\n' > "$d/netask.sh"
    add_pack sleeper "$d/sleeper.sh" '{"name":"sleeper","description":"Sleeps.","schema":{"type":"object","properties":{"seconds":{"type":"integer","minimum":0,"maximum":120}},"additionalProperties":false},"entry":"sleeper.sh","timeout_seconds":120,"class":"safe","category":"test"}'
    add_pack forkbomb "$d/forkbomb.sh" '{"name":"forkbomb","description":"A fork bomb.","schema":{"type":"object"},"entry":"forkbomb.sh","timeout_seconds":5,"class":"safe","category":"test"}'
    add_pack memhog "$d/memhog.py" '{"name":"memhog","description":"A memory hog.","schema":{"type":"object"},"entry":"memhog.py","timeout_seconds":30,"class":"safe","category":"test"}'
    add_pack diskfill "$d/diskfill.py" '{"name":"diskfill","description":"A disk filler.","schema":{"type":"object"},"entry":"diskfill.py","timeout_seconds":60,"class":"safe","category":"test"}'
    add_pack psview "$d/psview.py" '{"name":"psview","description":"Lists the processes it sees.","schema":{"type":"object"},"entry":"psview.py","timeout_seconds":10,"class":"safe","category":"test"}'
    add_pack warmprobe "$d/warmprobe.py" '{"name":"warmprobe","description":"Prints its scheduling.","schema":{"type":"object"},"entry":"warmprobe.py","timeout_seconds":10,"class":"safe","category":"test"}'
    add_pack netask "$d/netask.sh" '{"name":"netask","description":"Asks for network, not granted.","schema":{"type":"object"},"entry":"netask.sh","timeout_seconds":5,"class":"safe","category":"test","sandbox":{"network":true}}'
    ongrid-skill reload
}

# A run sees only its own processes under the unit's ProtectProc=invisible:
# /proc lists its entry and its child, PID 1's command line does not read,
# and the report says `proc: own`.
check_proc_own() {
    api_run psview '{}' "$work/psview.json"
    cat "$work/psview.json"; echo
    [ "$(outcome "$work/psview.json")" = ok ] || { why "outcome $(outcome "$work/psview.json")"; return 1; }
    json "$work/psview.json" 'r["sandbox"]["proc"] == "own"' >/dev/null ||
        why "sandbox.proc is $(json "$work/psview.json" 'r["sandbox"]["proc"]')"
    json "$work/psview.json" 'set(r["result"]["pids"]) == {r["result"]["me"], r["result"]["child"]}' >/dev/null ||
        why "pids seen: $(json "$work/psview.json" 'r["result"]')"
    json "$work/psview.json" 'r["result"]["init_cmdline"] is False' >/dev/null ||
        why "PID 1's command line read"
    [ ! -s "$work/why" ]
}

# Warm runs under the real unit: with a grant, the pool's idle processes
# wait at SCHED_IDLE (the unit keeps CAP_SYS_NICE), and a request takes one
# (its report says warm) that runs at the default policy. The grant is
# removed after, so no idle process outlives the check.
check_warm_idle() {
    local conf=/etc/ongrid/executor.toml i cls
    cp "$conf" "$work/executor.toml.before"
    printf '\n[skills.warmprobe]\nwarm = 2\n' >> "$conf"
    if ! systemctl restart ongrid-executor.service; then
        why "restart with the warm grant failed"
        cp "$work/executor.toml.before" "$conf"
        systemctl restart ongrid-executor.service
        return 1
    fi
    # The first run is a miss and starts the pool.
    api_run warmprobe '{}' "$work/warm-first.json"
    [ "$(outcome "$work/warm-first.json")" = ok ] || why "first run: $(head -c 300 "$work/warm-first.json")"
    for i in $(seq 1 100); do
        cls=$(ps -o cls= -u ongrid-skill | tr -d ' ' | sort | tr '\n' ' ')
        [ "$cls" = "IDL IDL " ] && break
        sleep 0.2
    done
    info warm-idle "idle warm processes' scheduling classes: ${cls:-none}"
    [ "$cls" = "IDL IDL " ] || why "the pool's processes are not 2 at SCHED_IDLE: '$cls'"
    api_run warmprobe '{}' "$work/warm-taken.json"
    cat "$work/warm-taken.json"; echo
    json "$work/warm-taken.json" 'r["warm"] is True' >/dev/null || why "the second run was not warm"
    json "$work/warm-taken.json" 'r["result"] == {"policy": 0, "nice": 0}' >/dev/null ||
        why "a taken warm run's scheduling: $(json "$work/warm-taken.json" 'r.get("result")')"
    cp "$work/executor.toml.before" "$conf"
    systemctl restart ongrid-executor.service || why "restart without the warm grant failed"
    for i in $(seq 1 50); do
        pgrep -u ongrid-skill >/dev/null || break
        sleep 0.2
    done
    pgrep -u ongrid-skill >/dev/null && why "warm processes left after the grant went: $(pgrep -u ongrid-skill -a | head -n 3)"
    [ ! -s "$work/why" ]
}

# After a hostile run: nothing of it left, and the next run works.
aftermath() {
    local left
    sleep 1
    left=$(pgrep -u ongrid-skill -a 2>/dev/null | head -n 5)
    [ -z "$left" ] || why "processes of ongrid-skill left: $left"
    api_run echo '{"message":"after"}' "$work/after.json"
    [ "$(outcome "$work/after.json")" = ok ] || why "the next run: $(head -c 300 "$work/after.json")"
    [ "$(systemctl is-active ongrid-executor.service)" = active ] || why "executor is $(systemctl is-active ongrid-executor.service)"
}

check_fork_bomb() {
    local start=$SECONDS
    api_run forkbomb '{}' "$work/forkbomb.json"
    cat "$work/forkbomb.json"; echo
    info fork-bomb "outcome $(outcome "$work/forkbomb.json"), limit $(json "$work/forkbomb.json" 'r.get("limit")'), $((SECONDS - start))s"
    [ "$(outcome "$work/forkbomb.json")" != ok ] || why "the fork bomb ended ok"
    [ "$(outcome "$work/forkbomb.json")" != none ] || why "no report: $(head -c 300 "$work/forkbomb.json")"
    ((SECONDS - start < 30)) || why "took $((SECONDS - start))s (timeout 5s)"
    aftermath
    [ ! -s "$work/why" ]
}

check_memory_hog() {
    api_run memhog '{}' "$work/memhog.json"
    cat "$work/memhog.json"; echo
    info memory-hog "outcome $(outcome "$work/memhog.json"), limit $(json "$work/memhog.json" 'r.get("limit")')"
    json "$work/memhog.json" 'r.get("limit") == "memory"' >/dev/null ||
        why "not stopped at the memory bound: outcome $(outcome "$work/memhog.json"), limit $(json "$work/memhog.json" 'r.get("limit")')"
    aftermath
    [ ! -s "$work/why" ]
}

# The run directory is on the unit's tmpfs charged to the run's memory
# cgroup: the filler is stopped by the memory bound or a full tmpfs, and
# the root file system does not lose the space.
check_disk_filler() {
    local before after
    before=$(df -Pk / | awk 'NR == 2 { print $4 }')
    api_run diskfill '{}' "$work/diskfill.json"
    cat "$work/diskfill.json"; echo
    after=$(df -Pk / | awk 'NR == 2 { print $4 }')
    info disk-filler "outcome $(outcome "$work/diskfill.json"), limit $(json "$work/diskfill.json" 'r.get("limit")'), result $(json "$work/diskfill.json" 'r.get("result")'), root fs free $((before / 1024)) -> $((after / 1024)) MiB"
    if [ "$(outcome "$work/diskfill.json")" = ok ]; then
        json "$work/diskfill.json" 'r["result"]["mib"] < 4096 and r["result"]["error"]' >/dev/null ||
            why "the filler wrote all it wanted: $(json "$work/diskfill.json" 'r["result"]')"
    fi
    [ "$(outcome "$work/diskfill.json")" != none ] || why "no report: $(head -c 300 "$work/diskfill.json")"
    ((before - after < 100 * 1024)) || why "the root file system lost $(((before - after) / 1024)) MiB"
    aftermath
    [ ! -s "$work/why" ]
}
