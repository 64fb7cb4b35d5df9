"""Recording scheduler and system-call events through tracefs around a
command, for `wakeups.py`, `phases.py` and `syscalls.py` (run as root)."""
import os
import re
import subprocess
import sys

TRACING = '/sys/kernel/tracing'
# One event line with `options/record-tgid`: comm, tid, tgid, CPU, time (s),
# event, the rest.
LINE = re.compile(r'^\s*(.+?)-(\d+)\s+\(\s*([\d-]+)\)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (\w+): (.*)$')


def put(path, value):
    with open(os.path.join(TRACING, path), 'w') as f:
        f.write(value)


def record(out, command, events, buffer_kb):
    """Runs `command` with `events` (`group/name`) enabled; writes the trace to `out`."""
    if not os.path.exists(os.path.join(TRACING, 'trace')):
        subprocess.run(['mount', '-t', 'tracefs', 'nodev', TRACING], check=True)
    put('tracing_on', '0')
    put('trace', '')
    put('buffer_size_kb', str(buffer_kb))
    put('options/record-tgid', '1')
    for e in events:
        put(f'events/{e}/enable', '1')
    put('tracing_on', '1')
    try:
        subprocess.run(command, check=True)
    finally:
        put('tracing_on', '0')
        for e in events:
            put(f'events/{e}/enable', '0')
    with open(os.path.join(TRACING, 'trace')) as src, open(out, 'w') as dst:
        for line in src:
            dst.write(line)


def overflowed(line):
    """Whether a trace header line says events were dropped."""
    m = re.search(r'entries-in-buffer/entries-written: (\d+)/(\d+)', line)
    return bool(m) and m.group(1) != m.group(2)


class Trace:
    """A recorded trace, read event by event (`events`): `tgid` maps
    each thread met so far to its process, `lost` says (once read through)
    whether the buffer overflowed."""

    def __init__(self, path):
        self.path, self.tgid, self.lost = path, {}, False

    def events(self):
        """Each event in order: comm, tid, CPU, time (µs), event, the rest."""
        with open(self.path) as f:
            for line in f:
                if 'entries-in-buffer' in line:
                    self.lost = overflowed(line)
                m = LINE.match(line)
                if not m:
                    continue
                name, tid, group, cpu, t, event, rest = m.groups()
                tid = int(tid)
                if group.strip('-'):
                    self.tgid[tid] = int(group)
                yield name, tid, int(cpu), float(t) * 1e6, event, rest

    def process(self, tid):
        """The process of thread `tid` (itself when not known)."""
        return self.tgid.get(tid, tid)


def main(doc, events, buffer_kb, parse):
    """`SCRIPT OUT -- COMMAND...` records then parses; `SCRIPT --parse OUT` parses."""
    if len(sys.argv) >= 3 and sys.argv[1] == '--parse':
        parse(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[2] == '--':
        record(sys.argv[1], sys.argv[3:], events, buffer_kb)
        parse(sys.argv[1])
    else:
        sys.exit(doc)
