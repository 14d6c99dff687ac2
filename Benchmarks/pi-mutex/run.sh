#!/bin/sh
# Builds and runs the priority-inheritance mutex study (no Swift involved).
#   ./run.sh [mode] [reps] [ms-per-contended-run]     mode: all | uncontended | contended | inversion
# Output binary goes to ${PI_MUTEX_OUT:-/tmp/pi-mutex}.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${PI_MUTEX_OUT:-/tmp/pi-mutex}

echo "# machine"
echo "nproc: $(nproc)"
echo "kernel: $(uname -r)"
echo "glibc: $(ldd --version | head -1)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "ulimit -r (RLIMIT_RTPRIO): $(ulimit -r)"
echo "uid: $(id -u); CapEff: $(grep CapEff /proc/self/status | awk '{print $2}')"
echo "sched_rt_runtime_us: $(cat /proc/sys/kernel/sched_rt_runtime_us 2>/dev/null || echo '?')"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if chrt -f 10 true 2>/dev/null; then echo "SCHED_FIFO as this user: allowed"; else echo "SCHED_FIFO as this user: refused"; fi
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    if setpriv --reuid=65534 --regid=65534 --clear-groups chrt -f 10 true 2>/dev/null; then
        echo "SCHED_FIFO as uid 65534: allowed"
    else
        echo "SCHED_FIFO as uid 65534: refused (EPERM without CAP_SYS_NICE and RLIMIT_RTPRIO = 0)"
    fi
fi

clang -O2 -pthread -Wall -Wextra -o "$out" "$here/pi-mutex.c"
exec "$out" "${1:-all}" "${2:-5}" "${3:-200}"
