#!/usr/bin/env python3
"""Top frames of a `perf record -g` profile of feed-server, self and inclusive.

    perf record -e cpu-clock -F 999 -g -p "$(pgrep -n feed-server)" -o perf.data -- sleep 8
    python3 Examples/scripts/perf-top.py perf.data Examples/.build-release/release/feed-server [25]

Resolves feed-server's own frames with nm and `swift demangle` (perf 6.1 here cannot read the
Swift binary's ELF: "symsrc__init: cannot get elf header"; libraries and the kernel it resolves
itself). Inclusive: the share of samples with the frame anywhere on the stack."""
import bisect, collections, re, subprocess, sys
data, binary, top = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 25
syms = []
for line in subprocess.run(['nm', '-n', '--defined-only', binary], capture_output=True, text=True).stdout.splitlines():
    parts = line.split(' ', 2)
    if len(parts) == 3 and parts[1] in 'tTwW':
        syms.append((int(parts[0], 16), parts[2]))
addrs = [a for a, _ in syms]
script = subprocess.run(['perf', 'script', '-i', data, '-F', 'comm,ip,sym,dso'], capture_output=True, text=True).stdout
samples, stack, comms, comm = [], [], [], ''
frame = re.compile(r'^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)$')
for line in script.splitlines() + ['']:
    m = frame.match(line)
    if line and not line[0].isspace():
        comm = line.split()[0]
    elif m:
        ip, sym, dso = m.groups()
        if sym.startswith('[unknown]') and dso.endswith('feed-server'):
            i = bisect.bisect_right(addrs, int(ip, 16)) - 1
            sym = syms[i][1] if i >= 0 else '?'
        sym = re.sub(r'\+0x[0-9a-f]+$', '', sym)
        stack.append(sym)
    elif not line.strip():
        if stack:
            samples.append(stack)
            comms.append(comm)
        stack = []
names = sorted({s for st in samples for s in st})
dem = subprocess.run(['swift', 'demangle', '--simplified', '--compact'], input='\n'.join(names), capture_output=True, text=True).stdout.splitlines()
pretty = dict(zip(names, dem)) if len(dem) == len(names) else {n: n for n in names}
def short(s):
    s = pretty.get(s, s)
    return s if len(s) < 160 else s[:157] + '...'
self_c, incl_c = collections.Counter(), collections.Counter()
for st in samples:
    self_c[short(st[0])] += 1
    for s in {short(x) for x in st}: incl_c[s] += 1
n = len(samples)
print(f'samples: {n}')
areas = [('NIO event-loop threads', lambda st, c: c.startswith('NIO-')),
         ('  of which writev (kernel TCP send, and the loopback receive it triggers)', lambda st, c: c.startswith('NIO-') and '__GI___writev' in st),
         ('  of which reads and epoll', lambda st, c: c.startswith('NIO-') and any(x in st for x in ('__GI___readv', '__libc_read', 'read', 'epoll_wait', '__GI_epoll_wait'))),
         ('Swift concurrency pool threads (tasks: pumps, actors, continuations)', lambda st, c: not c.startswith('NIO-')),
         ('swift_retain/swift_release (self, anywhere)', lambda st, c: st[0] in ('swift_retain', 'swift_release'))]
print('\nby area (% of samples):')
for name, test in areas:
    print(f'{100 * sum(1 for st, c in zip(samples, comms) if test(st, c)) / max(n, 1):6.2f}%  {name}')
print(f'\ntop {top} frames by self time (% of samples):')
for s, c in self_c.most_common(top): print(f'{100*c/n:6.2f}%  {s}')
print(f'\ntop {top} frames by inclusive time (% of samples with the frame on the stack; thread starts left out):')
shown = 0
for s, c in incl_c.most_common():
    if s in ('start_thread', '_dispatch_worker_thread', 'clone3', 'entry_SYSCALL_64_after_hwframe', 'do_syscall_64'): continue
    print(f'{100*c/n:6.2f}%  {s}'); shown += 1
    if shown >= top: break
