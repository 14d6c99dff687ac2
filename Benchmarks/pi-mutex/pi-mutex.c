// pi-mutex: cost and benefit of a priority-inheritance mutex on Linux, for
// AsyncBroadcast's sequence lock (today a glibc PTHREAD_MUTEX_ADAPTIVE_NP).
//
// Variants:
//   default   pthread_mutex_t, default attributes (what swift-nio's NIOLock uses)
//   adaptive  PTHREAD_MUTEX_ADAPTIVE_NP (what Sources/_CAtomics uses today)
//   pi        PTHREAD_PRIO_INHERIT (glibc PI mutex: FUTEX_LOCK_PI, no spinning)
//   spinpi    Synchronization.Mutex's Linux algorithm re-done in C: TID cmpxchg,
//             1000 x pause spin, then FUTEX_LOCK_PI_PRIVATE / FUTEX_UNLOCK_PI
//
// Modes:  uncontended | contended | inversion   (no argument: all)
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// MARK: - locks

enum kind { K_DEFAULT, K_ADAPTIVE, K_PI, K_SPINPI, K_COUNT };
static const char *kind_name[K_COUNT] = {"default", "adaptive", "pi", "spinpi"};

typedef struct {
    enum kind kind;
    pthread_mutex_t m;
    _Atomic uint32_t word; // spinpi: 0 | owner TID | owner TID|FUTEX_WAITERS
} lock_t;

static __thread uint32_t tls_tid;
static inline uint32_t my_tid(void) {
    if (tls_tid == 0) tls_tid = (uint32_t)syscall(SYS_gettid);
    return tls_tid;
}

static void lock_init(lock_t *l, enum kind k) {
    memset(l, 0, sizeof *l);
    l->kind = k;
    if (k == K_SPINPI) return;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    if (k == K_ADAPTIVE) pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    if (k == K_PI && pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT) != 0) abort();
    if (pthread_mutex_init(&l->m, &a) != 0) abort();
    pthread_mutexattr_destroy(&a);
}

static void lock_destroy(lock_t *l) { if (l->kind != K_SPINPI) pthread_mutex_destroy(&l->m); }

static inline void spinpi_lock(lock_t *l) {
    uint32_t self = my_tid(), expected = 0;
    if (atomic_compare_exchange_strong_explicit(&l->word, &expected, self,
            memory_order_acquire, memory_order_relaxed)) return;
    for (int tries = 1000; tries != 0; tries--) {
        if (atomic_load_explicit(&l->word, memory_order_relaxed) == 0) {
            expected = 0;
            if (atomic_compare_exchange_strong_explicit(&l->word, &expected, self,
                    memory_order_acquire, memory_order_relaxed)) return;
        }
        __builtin_ia32_pause();
    }
    for (;;) {
        if (syscall(SYS_futex, &l->word, FUTEX_LOCK_PI_PRIVATE, 0, NULL) == 0) return;
        if (errno != EINTR && errno != EAGAIN) { perror("FUTEX_LOCK_PI"); abort(); }
    }
}

static inline void spinpi_unlock(lock_t *l) {
    uint32_t expected = my_tid();
    if (atomic_compare_exchange_strong_explicit(&l->word, &expected, 0,
            memory_order_release, memory_order_relaxed)) return;
    while (syscall(SYS_futex, &l->word, FUTEX_UNLOCK_PI_PRIVATE) != 0) {
        if (errno != EINTR) { perror("FUTEX_UNLOCK_PI"); abort(); }
    }
}

static inline void lock_lock(lock_t *l) {
    if (l->kind == K_SPINPI) spinpi_lock(l);
    else if (pthread_mutex_lock(&l->m) != 0) abort();
}
static inline void lock_unlock(lock_t *l) {
    if (l->kind == K_SPINPI) spinpi_unlock(l);
    else if (pthread_mutex_unlock(&l->m) != 0) abort();
}

// MARK: - time and work

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// CPU work, counted in iterations (not wall time) so that a preempted
// holder still owes the same amount of work when it runs again.
static volatile uint64_t sink;
static inline void work(uint64_t iters) {
    uint64_t x = iters | 1;
    for (uint64_t i = 0; i < iters; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}
static double ns_per_iter;
static uint64_t iters_for_ns(double ns) {
    uint64_t n = (uint64_t)(ns / ns_per_iter + 0.5);
    return n ? n : 1;
}
static void calibrate(void) {
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        uint64_t t0 = now_ns();
        work(20000000);
        double v = (double)(now_ns() - t0) / 20000000.0;
        if (v < best) best = v;
    }
    ns_per_iter = best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void pin_to(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (pthread_setaffinity_np(pthread_self(), sizeof s, &s) != 0) { perror("affinity"); exit(1); }
}

// MARK: - uncontended

static void run_uncontended(int reps) {
    const uint64_t N = 20000000;
    printf("\n## uncontended lock+unlock, 1 thread, %llu pairs x %d reps (ns/pair, median [min..max])\n",
           (unsigned long long)N, reps);
    for (int k = 0; k < K_COUNT; k++) {
        double v[32];
        for (int r = 0; r < reps; r++) {
            lock_t l;
            lock_init(&l, (enum kind)k);
            uint64_t t0 = now_ns();
            for (uint64_t i = 0; i < N; i++) { lock_lock(&l); lock_unlock(&l); }
            v[r] = (double)(now_ns() - t0) / (double)N;
            lock_destroy(&l);
        }
        double lo = v[0], hi = v[0];
        for (int r = 1; r < reps; r++) { if (v[r] < lo) lo = v[r]; if (v[r] > hi) hi = v[r]; }
        printf("uncontended %-8s %6.2f ns  [%.2f..%.2f]\n", kind_name[k], median(v, reps), lo, hi);
    }
}

// MARK: - contended

#define HIST 200000 // 1 ns buckets up to 200 us; beyond goes to the last bucket
typedef struct {
    lock_t *lock;
    uint64_t cs_iters, out_iters, ops;
    int timed;
    uint32_t *hist;
    uint64_t maxwait;
} worker_t;
static _Atomic int stop_flag, go_flag;
static uint64_t shared_counter;

static void *worker(void *p) {
    worker_t *w = p;
    while (!atomic_load_explicit(&go_flag, memory_order_acquire)) __builtin_ia32_pause();
    uint64_t ops = 0;
    while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
        if (w->timed) {
            uint64_t t0 = now_ns();
            lock_lock(w->lock);
            uint64_t d = now_ns() - t0;
            w->hist[d < HIST ? d : HIST - 1]++;
            if (d > w->maxwait) w->maxwait = d;
        } else {
            lock_lock(w->lock);
        }
        work(w->cs_iters);
        shared_counter++;
        lock_unlock(w->lock);
        work(w->out_iters);
        ops++;
    }
    w->ops = ops;
    return NULL;
}

typedef struct { double ops_per_s, fair, p50, p99, max; } cres_t;

static cres_t contended_once(enum kind k, int nthreads, uint64_t cs, uint64_t out, int timed, int ms) {
    lock_t l;
    lock_init(&l, k);
    pthread_t th[16];
    worker_t w[16];
    atomic_store(&stop_flag, 0);
    atomic_store(&go_flag, 0);
    for (int i = 0; i < nthreads; i++) {
        w[i] = (worker_t){.lock = &l, .cs_iters = cs, .out_iters = out, .timed = timed};
        if (timed) w[i].hist = calloc(HIST, sizeof(uint32_t));
        pthread_create(&th[i], NULL, worker, &w[i]);
    }
    usleep(2000);
    uint64_t t0 = now_ns();
    atomic_store_explicit(&go_flag, 1, memory_order_release);
    usleep((useconds_t)ms * 1000);
    atomic_store_explicit(&stop_flag, 1, memory_order_relaxed);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    double secs = (double)(now_ns() - t0) / 1e9;
    cres_t r = {0};
    uint64_t total = 0, mn = UINT64_MAX, mx = 0;
    for (int i = 0; i < nthreads; i++) {
        total += w[i].ops;
        if (w[i].ops < mn) mn = w[i].ops;
        if (w[i].ops > mx) mx = w[i].ops;
    }
    r.ops_per_s = (double)total / secs;
    r.fair = mx ? (double)mn / (double)mx : 0;
    if (timed) {
        uint64_t *h = calloc(HIST, sizeof(uint64_t)), n = 0, m = 0;
        for (int i = 0; i < nthreads; i++) {
            for (int b = 0; b < HIST; b++) h[b] += w[i].hist[b];
            if (w[i].maxwait > m) m = w[i].maxwait;
            free(w[i].hist);
        }
        for (int b = 0; b < HIST; b++) n += h[b];
        uint64_t acc = 0;
        double p50 = -1, p99 = -1;
        for (int b = 0; b < HIST; b++) {
            acc += h[b];
            if (p50 < 0 && acc * 2 >= n) p50 = b;
            if (p99 < 0 && acc * 100 >= n * 99) { p99 = b; break; }
        }
        r.p50 = p50; r.p99 = p99; r.max = (double)m;
        free(h);
    }
    lock_destroy(&l);
    return r;
}

static void run_contended(int reps, int ms) {
    const double cs_ns[2] = {20, 1000};
    const double out_ns = 200;
    const int threads[2] = {2, 4};
    printf("\n## contended: each thread loops {lock; work(cs); counter++; unlock; work(%.0f ns)}\n", out_ns);
    printf("## %d ms per run, %d reps; ops/s from untimed runs, waits (clock_gettime around lock) from separate timed runs\n", ms, reps);
    printf("## fairness = min/max ops per thread (1 = even)\n");
    printf("%-8s %2s %6s %12s %6s %9s %9s %10s\n", "mutex", "T", "cs_ns", "Mops/s", "fair", "p50_ns", "p99_ns", "max_us");
    for (int ci = 0; ci < 2; ci++)
        for (int ti = 0; ti < 2; ti++)
            for (int k = 0; k < K_COUNT; k++) {
                double ops[32], fair[32], p50[32], p99[32], mx[32];
                uint64_t cs = iters_for_ns(cs_ns[ci]), out = iters_for_ns(out_ns);
                for (int r = 0; r < reps; r++) {
                    cres_t u = contended_once((enum kind)k, threads[ti], cs, out, 0, ms);
                    cres_t t = contended_once((enum kind)k, threads[ti], cs, out, 1, ms);
                    ops[r] = u.ops_per_s / 1e6; fair[r] = u.fair;
                    p50[r] = t.p50; p99[r] = t.p99; mx[r] = t.max / 1000.0;
                }
                printf("%-8s %2d %6.0f %12.3f %6.2f %9.0f %9.0f %10.0f\n", kind_name[k], threads[ti],
                       cs_ns[ci], median(ops, reps), median(fair, reps), median(p50, reps),
                       median(p99, reps), median(mx, reps));
                fflush(stdout);
            }
}

// MARK: - priority inversion

// Three threads pinned to CPU 0: L (low) takes the lock and owes `hold_ms`
// of CPU work inside it; once L holds it, M (medium) becomes runnable and
// burns CPU for `hog_ms` of wall time; then H (high) wants the lock.
// Reported: how long H waits for the lock.
typedef struct { int policy, prio, nice; } prio_t;
typedef struct {
    lock_t *lock;
    prio_t pr;
    sem_t start;
    uint64_t arg, t_wait;
    int ok;
    _Atomic int held, running;
    _Atomic int *other_running; // L: M's `running`
} inv_t;

static int apply_prio(prio_t p) {
    struct sched_param sp = {.sched_priority = p.prio};
    if (pthread_setschedparam(pthread_self(), p.policy, &sp) != 0) return 0;
    if (p.policy == SCHED_OTHER || p.policy == SCHED_BATCH)
        if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), p.nice) != 0) return 0;
    return 1;
}

static void *inv_low(void *p) {
    inv_t *t = p;
    pin_to(0);
    t->ok = apply_prio(t->pr);
    lock_lock(t->lock);
    atomic_store(&t->held, 1);
    // Owe all of the critical section's work after M competes for the CPU,
    // so the result does not depend on how fast M's wake-up was.
    while (!atomic_load(t->other_running)) __builtin_ia32_pause();
    work(t->arg);
    lock_unlock(t->lock);
    return NULL;
}
static void *inv_mid(void *p) {
    inv_t *t = p;
    pin_to(0);
    t->ok = apply_prio(t->pr);
    sem_wait(&t->start);
    atomic_store(&t->running, 1);
    uint64_t end = now_ns() + t->arg;
    while (now_ns() < end) work(1000);
    return NULL;
}
static void *inv_high(void *p) {
    inv_t *t = p;
    pin_to(0);
    t->ok = apply_prio(t->pr);
    sem_wait(&t->start);
    uint64_t t0 = now_ns();
    lock_lock(t->lock);
    t->t_wait = now_ns() - t0;
    lock_unlock(t->lock);
    return NULL;
}

static double inversion_once(enum kind k, prio_t lo, prio_t mid, prio_t hi, double hold_ms, double hog_ms, int *ok) {
    lock_t l;
    lock_init(&l, k);
    inv_t L = {.lock = &l, .pr = lo, .arg = iters_for_ns(hold_ms * 1e6)};
    inv_t M = {.lock = &l, .pr = mid, .arg = (uint64_t)(hog_ms * 1e6)};
    inv_t H = {.lock = &l, .pr = hi};
    L.other_running = &M.running;
    sem_init(&M.start, 0, 0);
    sem_init(&H.start, 0, 0);
    pthread_t tl, tm, th;
    pthread_create(&tm, NULL, inv_mid, &M);
    pthread_create(&th, NULL, inv_high, &H);
    usleep(5000); // M and H are parked in sem_wait, with their priorities set
    pthread_create(&tl, NULL, inv_low, &L);
    while (!atomic_load(&L.held)) usleep(50);
    sem_post(&M.start);
    while (!atomic_load(&M.running)) usleep(50);
    usleep(1000);
    sem_post(&H.start);
    pthread_join(th, NULL);
    pthread_join(tm, NULL);
    pthread_join(tl, NULL);
    *ok = L.ok && M.ok && H.ok;
    sem_destroy(&M.start);
    sem_destroy(&H.start);
    lock_destroy(&l);
    return (double)H.t_wait / 1e6;
}

static void run_inversion(int reps) {
    pin_to(1); // the orchestrating thread stays off CPU 0
    struct {
        const char *name;
        prio_t lo, mid, hi;
        double hold_ms, hog_ms;
    } sc[] = {
        {"RT: L=FIFO 10, M=FIFO 20, H=FIFO 30", {SCHED_FIFO, 10, 0}, {SCHED_FIFO, 20, 0}, {SCHED_FIFO, 30, 0}, 2, 100},
        {"nice: L=nice 19, M=nice 0, H=nice -20", {SCHED_OTHER, 0, 19}, {SCHED_OTHER, 0, 0}, {SCHED_OTHER, 0, -20}, 10, 400},
        {"idle: L=SCHED_IDLE, M=nice 0, H=nice -20", {SCHED_IDLE, 0, 0}, {SCHED_OTHER, 0, 0}, {SCHED_OTHER, 0, -20}, 10, 400},
        {"RT H only: L=nice 0, M=nice 0, H=FIFO 30", {SCHED_OTHER, 0, 0}, {SCHED_OTHER, 0, 0}, {SCHED_FIFO, 30, 0}, 2, 400},
    };
    printf("\n## priority inversion: L holds the lock for hold ms of CPU work; M hogs CPU 0 for hog ms of wall time; then H locks\n");
    printf("## all pinned to CPU 0; H's lock wait in ms, median of %d [min..max]\n", reps);
    for (size_t s = 0; s < sizeof sc / sizeof sc[0]; s++) {
        printf("%s (hold %.0f ms, hog %.0f ms)\n", sc[s].name, sc[s].hold_ms, sc[s].hog_ms);
        for (int k = 0; k < K_COUNT; k++) {
            double v[32];
            int allok = 1;
            for (int r = 0; r < reps; r++) {
                int ok;
                v[r] = inversion_once((enum kind)k, sc[s].lo, sc[s].mid, sc[s].hi, sc[s].hold_ms, sc[s].hog_ms, &ok);
                allok &= ok;
            }
            double lo = v[0], hi = v[0];
            for (int r = 1; r < reps; r++) { if (v[r] < lo) lo = v[r]; if (v[r] > hi) hi = v[r]; }
            printf("  inversion %-8s H waited %8.2f ms [%.2f..%.2f]%s\n", kind_name[k], median(v, reps), lo, hi,
                   allok ? "" : "  (setting a priority FAILED: EPERM?)");
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    int ms = argc > 3 ? atoi(argv[3]) : 200;
    if (reps < 1 || reps > 32) reps = 5;
    calibrate();
    printf("# pi-mutex: work() calibrated at %.3f ns/iter (20 ns = %llu iters, 1 us = %llu iters)\n", ns_per_iter,
           (unsigned long long)iters_for_ns(20), (unsigned long long)iters_for_ns(1000));
    if (!strcmp(mode, "all") || !strcmp(mode, "uncontended")) run_uncontended(reps);
    if (!strcmp(mode, "all") || !strcmp(mode, "contended")) run_contended(reps, ms);
    if (!strcmp(mode, "all") || !strcmp(mode, "inversion")) run_inversion(reps);
    return 0;
}
