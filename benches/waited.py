#!/usr/bin/env python3
"""How long a started process takes from its args to its exit, by how long
it waited for them: the floor under a warm run, with no box and no daemon.

usage: waited.py [--waits 0,1,2,4,8,16,200] [--runs 40] [--spinners] [--touch]

RUNS rounds, each over every wait in turn: spawns the py-json skill
(`/usr/bin/python3` importing `json`, reading its args from stdin and
echoing them), waits until it sleeps in `read(0, ...)`
(`/proc/PID/syscall`), sleeps WAIT ms, then times the args' write to the
output's end of file and to the reaping. Prints per wait the p50s of those
and of the process's whole user time, system time and minor faults.

--spinners: one busy loop per CPU at `SCHED_IDLE` meanwhile, so no CPU
halts while the skill waits (they yield to anything else). --touch: each
wait measured a second time in the same rounds, the skill's writable
private memory read through `/proc/PID/mem` just before its args, so its
data is in the caches. Run it pinned (`taskset -c 1`) too.
"""
import argparse, os, platform, statistics, sys, tempfile, time

SCRIPT = (
    "#!/usr/bin/python3\nimport json, sys\nargs = json.load(sys.stdin)\n"
    "sys.stdout.write(json.dumps(args, separators=(',', ':')))\n"
)
ARGS = b'{"a":1}'
# `read`'s number as /proc/PID/syscall shows it.
SYS_READ = {'x86_64': 0, 'aarch64': 63}


def spawn(entry):
    r0, w0 = os.pipe()
    r1, w1 = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(r0, 0)
            os.dup2(w1, 1)
            os.closerange(3, 1024)
            os.execve(entry, [entry], {})
        finally:
            os._exit(127)
    os.close(r0)
    os.close(w1)
    return pid, w0, r1


def wait_reading(pid, read_nr):
    deadline = time.monotonic() + 10
    want = f'{read_nr} 0x0 '
    while not open(f'/proc/{pid}/syscall').read().startswith(want):
        if time.monotonic() > deadline:
            sys.exit(f'process {pid} never read its stdin')
        time.sleep(0.0002)


def touch(pid):
    """Reads the process's writable anonymous mappings and heap."""
    with open(f'/proc/{pid}/maps') as maps, open(f'/proc/{pid}/mem', 'rb', 0) as mem:
        for line in maps:
            f = line.split()
            if f[1].startswith('rw') and (f[4] == '0' or f[-1] == '[heap]'):
                start, end = (int(x, 16) for x in f[0].split('-'))
                try:
                    mem.seek(start)
                    mem.read(end - start)
                except OSError:
                    pass


def take(pid, w, r):
    t0 = time.perf_counter()
    os.write(w, ARGS)
    os.close(w)
    out = b''
    while chunk := os.read(r, 4096):
        out += chunk
    t1 = time.perf_counter()
    _, status, ru = os.wait4(pid, 0)
    t2 = time.perf_counter()
    os.close(r)
    if out != ARGS or status != 0:
        sys.exit(f'the skill answered {out!r} with status {status}')
    return ((t1 - t0) * 1e6, (t2 - t0) * 1e6, ru.ru_utime * 1e6, ru.ru_stime * 1e6, ru.ru_minflt)


def start_spinners():
    pids = []
    for _ in range(os.cpu_count() or 1):
        pid = os.fork()
        if pid == 0:
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                while True:
                    pass
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--waits', default='0,1,2,4,8,16,200')
    ap.add_argument('--runs', type=int, default=40)
    ap.add_argument('--spinners', action='store_true')
    ap.add_argument('--touch', action='store_true')
    a = ap.parse_args()
    read_nr = SYS_READ.get(platform.machine())
    if read_nr is None:
        sys.exit(f'no read(2) number known for {platform.machine()}')
    waits = [float(x) for x in a.waits.split(',')]
    spinners = start_spinners() if a.spinners else []
    try:
        with tempfile.TemporaryDirectory(prefix='waited') as d:
            entry = os.path.join(d, 'run')
            with open(entry, 'w') as f:
                f.write(SCRIPT)
            os.chmod(entry, 0o755)
            cases = [(wait, t) for wait in waits for t in ([False, True] if a.touch else [False])]
            got = {case: [] for case in cases}
            # Round-robin over the cases, so each sees the same hours of the host.
            for _ in range(a.runs):
                for wait, touched in cases:
                    pid, w, r = spawn(entry)
                    wait_reading(pid, read_nr)
                    time.sleep(wait / 1000)
                    if touched:
                        touch(pid)
                    got[(wait, touched)].append(take(pid, w, r))
                    time.sleep(0.005)
    finally:
        for pid in spinners:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    print(f'p50s of {a.runs} runs; user, system and faults are the whole process\'s')
    print(f'{"wait ms":>8} {"touched":>7} {"args->EOF us":>13} {"args->reaped us":>16} '
          f'{"user us":>8} {"system us":>10} {"minflt":>7}')
    for (wait, touched), runs in got.items():
        p50 = [statistics.median(g[i] for g in runs) for i in range(5)]
        print(f'{wait:8g} {"yes" if touched else "no":>7} {p50[0]:13.0f} {p50[1]:16.0f} '
              f'{p50[2]:8.0f} {p50[3]:10.0f} {p50[4]:7.0f}')


if __name__ == '__main__':
    main()
