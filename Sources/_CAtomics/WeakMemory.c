// A weak-memory model for the deterministic checkers (fuzz targets, litmus
// runner): every store a *logical thread* makes to one of our atomics waits in
// that thread's store buffer until something drains it, so another logical
// thread can read the old value after the store was made.
//
// Only builds with `ASYNCBROADCAST_WEAK_MEMORY=1` route `AtomicInt` and `Lock`
// through here (see AtomicInt.swift); everyone else calls the inline C11
// functions of _CAtomics.h and never reaches this file.
//
// The model is TSO (x86's memory model) plus a release-only unlock:
// - A store (relaxed, release or seq_cst) is appended to the calling logical
//   thread's FIFO buffer. Memory (the real atomic word) changes when it drains.
// - A load reads the thread's own newest buffered store to that word (store
//   forwarding), else memory. A seq_cst load first drains the thread's buffer
//   up to its last seq_cst store (seq_cst operations are totally ordered).
// - Fences, read-modify-writes (CAS, exchange, fetch-add, fetch-or) and
//   lock() drain the calling thread's whole buffer (they are locked
//   instructions on x86 and full barriers on ARMv8 with LSE). A failed CAS
//   is only a load, as in C11: it drains nothing.
// - unlock() is a release only: it drains nothing, it records where the
//   releasing thread's buffer stood; a later lock() of the same mutex (by any
//   thread) drains the releaser's buffer up to that point, which is what
//   happens-before through a mutex means. A store made inside a critical
//   section can therefore still be invisible to a thread that does not take
//   the lock, as on ARM, and the model shows the fence a lock does not give.
// - Preemption: before each operation of a modelled thread that holds none
//   of our locks, a harness hook (`cab_wm_set_preempt_hook`) may run another
//   logical thread's code right there, on the same OS thread, as loom does.
// - The harness drains buffers whenever its input says (`cab_wm_drain`), and
//   stands in for synchronisation that is not ours (a task's completion
//   observed, a reference count dropping to zero): `cab_wm_drain`,
//   `cab_wm_runtime_sync` (every continuation resume calls it), and freeing
//   memory drains the stores to it first (`cab_wm_forget`).
// What it does not model: load-load and store-store reordering (ARM's, POWER's),
// plain (non-atomic) memory, the Swift runtime's own atomics.
//
// Threads: the harness names the logical thread of the calling OS thread with
// `cab_wm_set_thread` (0 ..< CAB_WM_THREADS). An OS thread that never named one
// (-1) is unmodelled: its operations go straight to memory, as in a normal build.
// Everything is serialised by one mutex, so unmodelled threads (the library's
// own tasks in the sharing fuzzer) may run beside the modelled ones.
#include "_CAtomics.h"
#include <string.h>

#define CAB_WM_CAPACITY 4096
#define CAB_WM_BUCKETS 1024

typedef struct cab_wm_entry {
    cab_atomic_int *address;
    intptr_t value;
    uint64_t stamp;
    bool seq_cst;
} cab_wm_entry;

typedef struct cab_wm_buffer {
    cab_wm_entry entries[CAB_WM_CAPACITY];
    intptr_t head;   // oldest entry
    intptr_t count;
} cab_wm_buffer;

typedef struct cab_wm_mark {
    struct cab_wm_mark *next;
    cab_lock *lock;
    intptr_t thread;
    uint64_t stamp;  // entries of `thread` up to this stamp were before the unlock
} cab_wm_mark;

static pthread_mutex_t cab_wm_mutex = PTHREAD_MUTEX_INITIALIZER;
static bool cab_wm_enabled = false;
static _Thread_local bool cab_wm_observer = false;  // the checker's own thread only
static uint64_t cab_wm_clock = 0;
static cab_wm_buffer cab_wm_buffers[CAB_WM_THREADS];
static cab_wm_mark *cab_wm_marks[CAB_WM_BUCKETS];
static uint64_t cab_wm_stats_buffered = 0, cab_wm_stats_stale = 0;
static _Thread_local intptr_t cab_wm_tid = -1;
static _Atomic(intptr_t) cab_wm_fault_bits = 0;

intptr_t cab_wm_faults(void) { return atomic_load_explicit(&cab_wm_fault_bits, memory_order_relaxed); }
void cab_wm_set_faults(intptr_t bits) { atomic_store_explicit(&cab_wm_fault_bits, bits, memory_order_relaxed); }

static void (*cab_wm_preempt_hook)(void) = NULL;
static _Thread_local bool cab_wm_in_hook = false;
static intptr_t cab_wm_lock_depth[CAB_WM_THREADS];

void cab_wm_set_preempt_hook(void (*_Nullable hook)(void)) { cab_wm_preempt_hook = hook; }

/// A preemption point: before each operation of a modelled thread that holds
/// none of our locks, the harness may run another logical thread's code
/// right here, on this OS thread (loom's way of exploring interleavings).
static inline void cab_wm_maybe_preempt(void) {
    if (cab_wm_preempt_hook == NULL || cab_wm_in_hook || !cab_wm_enabled || cab_wm_observer || cab_wm_tid < 0) return;
    if (cab_wm_lock_depth[cab_wm_tid] != 0) return;
    cab_wm_in_hook = true;
    cab_wm_preempt_hook();
    cab_wm_in_hook = false;
}

static inline void cab_wm_enter(void) { pthread_mutex_lock(&cab_wm_mutex); }
static inline void cab_wm_leave(void) { pthread_mutex_unlock(&cab_wm_mutex); }

/// The calling thread's buffer, or NULL when its operations go to memory.
static inline cab_wm_buffer *cab_wm_mine(void) {
    if (!cab_wm_enabled || cab_wm_observer || cab_wm_tid < 0) return NULL;
    return &cab_wm_buffers[cab_wm_tid];
}

static inline cab_wm_entry *cab_wm_at(cab_wm_buffer *b, intptr_t i) {
    return &b->entries[(b->head + i) % CAB_WM_CAPACITY];
}

static void cab_wm_drain_oldest(cab_wm_buffer *b, intptr_t n) {
    if (n > b->count) n = b->count;
    for (intptr_t i = 0; i < n; i++) {
        cab_wm_entry *e = cab_wm_at(b, 0);
        atomic_store_explicit(&e->address->value, e->value, memory_order_seq_cst);
        b->head = (b->head + 1) % CAB_WM_CAPACITY;
        b->count -= 1;
    }
}

static void cab_wm_drain_through_stamp(cab_wm_buffer *b, uint64_t stamp) {
    intptr_t n = 0;
    while (n < b->count && cab_wm_at(b, n)->stamp <= stamp) n++;
    cab_wm_drain_oldest(b, n);
}

static inline size_t cab_wm_bucket(const void *p) { return ((uintptr_t)p >> 6) % CAB_WM_BUCKETS; }

// MARK: Harness

void cab_wm_enable(bool on) {
    cab_wm_enter();
    if (!on) {
        for (intptr_t t = 0; t < CAB_WM_THREADS; t++) cab_wm_drain_oldest(&cab_wm_buffers[t], CAB_WM_CAPACITY);
    }
    cab_wm_enabled = on;
    cab_wm_leave();
}

bool cab_wm_is_enabled(void) { return cab_wm_enabled; }

void cab_wm_set_thread(intptr_t thread) {
    if (thread >= CAB_WM_THREADS) abort();
    cab_wm_tid = thread;
}

intptr_t cab_wm_thread(void) { return cab_wm_tid; }

void cab_wm_set_observer(bool on) {
    cab_wm_enter();
    cab_wm_observer = on;
    cab_wm_leave();
}

void cab_wm_drain(intptr_t thread, intptr_t count) {
    if (thread < 0 || thread >= CAB_WM_THREADS) return;
    cab_wm_enter();
    cab_wm_drain_oldest(&cab_wm_buffers[thread], count < 0 ? CAB_WM_CAPACITY : count);
    cab_wm_leave();
}

void cab_wm_drain_all(void) {
    cab_wm_enter();
    for (intptr_t t = 0; t < CAB_WM_THREADS; t++) cab_wm_drain_oldest(&cab_wm_buffers[t], CAB_WM_CAPACITY);
    cab_wm_leave();
}

intptr_t cab_wm_pending(intptr_t thread) {
    if (thread < 0 || thread >= CAB_WM_THREADS) return 0;
    cab_wm_enter();
    intptr_t n = cab_wm_buffers[thread].count;
    cab_wm_leave();
    return n;
}

void cab_wm_statistics(uint64_t *_Nonnull buffered, uint64_t *_Nonnull stale) {
    cab_wm_enter();
    *buffered = cab_wm_stats_buffered;
    *stale = cab_wm_stats_stale;
    cab_wm_leave();
}

// MARK: Operations

intptr_t cab_wm_load(cab_atomic_int *_Nonnull a, intptr_t order) {
    cab_wm_maybe_preempt();
    cab_wm_enter();
    intptr_t result;
    bool found = false;
    cab_wm_buffer *b = cab_wm_mine();
    if (b != NULL) {
        if (order == CAB_WM_SEQ_CST) {
            intptr_t last = -1;
            for (intptr_t i = 0; i < b->count; i++) if (cab_wm_at(b, i)->seq_cst) last = i;
            cab_wm_drain_oldest(b, last + 1);
        }
        for (intptr_t i = b->count - 1; i >= 0; i--) {
            cab_wm_entry *e = cab_wm_at(b, i);
            if (e->address == a) { result = e->value; found = true; break; }
        }
    } else if (cab_wm_enabled && cab_wm_observer) {
        // The checker's view: the newest store anyone made, drained or not.
        uint64_t newest = 0;
        for (intptr_t t = 0; t < CAB_WM_THREADS; t++) {
            cab_wm_buffer *other = &cab_wm_buffers[t];
            for (intptr_t i = 0; i < other->count; i++) {
                cab_wm_entry *e = cab_wm_at(other, i);
                if (e->address == a && e->stamp > newest) { newest = e->stamp; result = e->value; found = true; }
            }
        }
    }
    if (!found) {
        result = atomic_load_explicit(&a->value, memory_order_seq_cst);
        if (b != NULL) {
            // Count reads that some other thread's buffer makes stale.
            for (intptr_t t = 0; t < CAB_WM_THREADS && !found; t++) {
                cab_wm_buffer *other = &cab_wm_buffers[t];
                for (intptr_t i = 0; i < other->count; i++) {
                    if (cab_wm_at(other, i)->address == a) { cab_wm_stats_stale++; found = true; break; }
                }
            }
        }
    }
    cab_wm_leave();
    return result;
}

void cab_wm_store(cab_atomic_int *_Nonnull a, intptr_t value, intptr_t order) {
    cab_wm_maybe_preempt();
    cab_wm_enter();
    cab_wm_buffer *b = cab_wm_mine();
    if (b == NULL) {
        atomic_store_explicit(&a->value, value, memory_order_seq_cst);
    } else {
        if (b->count == CAB_WM_CAPACITY) cab_wm_drain_oldest(b, 1);
        cab_wm_entry *e = cab_wm_at(b, b->count);
        e->address = a;
        e->value = value;
        e->stamp = ++cab_wm_clock;
        e->seq_cst = order == CAB_WM_SEQ_CST;
        b->count += 1;
        cab_wm_stats_buffered++;
    }
    cab_wm_leave();
}

/// Before a read-modify-write or a fence: the calling thread's buffer drains.
static inline void cab_wm_drain_mine(void) {
    cab_wm_buffer *b = cab_wm_mine();
    if (b != NULL) cab_wm_drain_oldest(b, b->count);
}

typedef enum { CAB_WM_EXCHANGE, CAB_WM_FETCH_ADD, CAB_WM_FETCH_OR } cab_wm_rmw_kind;

/// An exchange, fetch-add or fetch-or: the calling thread's buffer drains
/// first (a locked instruction), then memory is updated at once.
static intptr_t cab_wm_rmw(cab_atomic_int *_Nonnull a, cab_wm_rmw_kind kind, intptr_t operand) {
    cab_wm_maybe_preempt();
    cab_wm_enter();
    cab_wm_drain_mine();
    intptr_t old;
    switch (kind) {
    case CAB_WM_EXCHANGE: old = atomic_exchange_explicit(&a->value, operand, memory_order_seq_cst); break;
    case CAB_WM_FETCH_ADD: old = atomic_fetch_add_explicit(&a->value, operand, memory_order_seq_cst); break;
    default: old = atomic_fetch_or_explicit(&a->value, operand, memory_order_seq_cst); break;
    }
    cab_wm_leave();
    return old;
}

intptr_t cab_wm_exchange(cab_atomic_int *_Nonnull a, intptr_t value) { return cab_wm_rmw(a, CAB_WM_EXCHANGE, value); }
intptr_t cab_wm_fetch_add(cab_atomic_int *_Nonnull a, intptr_t delta) { return cab_wm_rmw(a, CAB_WM_FETCH_ADD, delta); }
intptr_t cab_wm_fetch_or(cab_atomic_int *_Nonnull a, intptr_t bits) { return cab_wm_rmw(a, CAB_WM_FETCH_OR, bits); }

bool cab_wm_cas(cab_atomic_int *_Nonnull a, intptr_t *_Nonnull expected, intptr_t desired) {
    cab_wm_maybe_preempt();
    cab_wm_enter();
    cab_wm_buffer *b = cab_wm_mine();
    if (b != NULL) {
        bool mine = false;
        for (intptr_t i = 0; i < b->count && !mine; i++) mine = cab_wm_at(b, i)->address == a;
        intptr_t current = atomic_load_explicit(&a->value, memory_order_seq_cst);
        if (!mine && current != *expected) {
            // A failed compare-exchange is only a load (C11: its failure
            // order, acquire): it writes nothing and drains nothing. (x86's
            // `lock cmpxchg` would drain; ARM's CAS need not.)
            *expected = current;
            cab_wm_leave();
            return false;
        }
    }
    cab_wm_drain_mine();
    bool exchanged = atomic_compare_exchange_strong_explicit(&a->value, expected, desired,
                                                             memory_order_seq_cst, memory_order_seq_cst);
    cab_wm_leave();
    return exchanged;
}

void cab_wm_fence(void) {
    cab_wm_maybe_preempt();
    cab_wm_enter();
    cab_wm_drain_mine();
    cab_wm_leave();
}

void cab_wm_runtime_sync(void) { cab_wm_fence(); }

// MARK: Locks

static cab_wm_mark *cab_wm_find_mark(cab_lock *l) {
    for (cab_wm_mark *m = cab_wm_marks[cab_wm_bucket(l)]; m != NULL; m = m->next) {
        if (m->lock == l) return m;
    }
    return NULL;
}

/// After the mutex is ours: what its last releaser stored before unlocking
/// becomes visible, and our own buffer drains (acquiring is an RMW).
static void cab_wm_acquired(cab_lock *l) {
    cab_wm_enter();
    if (cab_wm_enabled && !cab_wm_observer) {
        cab_wm_mark *m = cab_wm_find_mark(l);
        if (m != NULL && m->thread != cab_wm_tid) cab_wm_drain_through_stamp(&cab_wm_buffers[m->thread], m->stamp);
        cab_wm_drain_mine();
    }
    cab_wm_leave();
}

static inline void cab_wm_count_lock(intptr_t delta) {
    if (cab_wm_tid >= 0) cab_wm_lock_depth[cab_wm_tid] += delta;
}

void cab_wm_note_lock(intptr_t delta) { cab_wm_count_lock(delta); }

// A lock made of one atomic word (the sequence gate), modelled like the
// mutex below: releasing it is a release only (the releaser's earlier stores
// stay buffered, up to a mark), and taking it makes what the last releaser
// stored before its release visible.

bool cab_wm_cas_release(cab_atomic_int *_Nonnull a, intptr_t *_Nonnull expected, intptr_t desired) {
    cab_wm_maybe_preempt();
    cab_wm_enter();
    bool exchanged = atomic_compare_exchange_strong_explicit(&a->value, expected, desired,
                                                             memory_order_seq_cst, memory_order_seq_cst);
    cab_wm_buffer *b = cab_wm_mine();
    if (exchanged && b != NULL) {
        cab_lock *key = (cab_lock *)(void *)a;
        cab_wm_mark *m = cab_wm_find_mark(key);
        if (b->count > 0) {
            if (m == NULL) {
                m = (cab_wm_mark *)malloc(sizeof(cab_wm_mark));
                if (m == NULL) abort();
                m->lock = key;
                m->next = cab_wm_marks[cab_wm_bucket(key)];
                cab_wm_marks[cab_wm_bucket(key)] = m;
            }
            m->thread = cab_wm_tid;
            m->stamp = cab_wm_at(b, b->count - 1)->stamp;
        } else if (m != NULL) {
            m->stamp = 0;
        }
    } else if (exchanged && !cab_wm_observer) {
        cab_wm_mark *m = cab_wm_find_mark((cab_lock *)(void *)a);
        if (m != NULL) m->stamp = 0;
    }
    cab_wm_leave();
    return exchanged;
}

void cab_wm_word_lock_acquired(cab_atomic_int *_Nonnull a) { cab_wm_acquired((cab_lock *)(void *)a); }

void cab_wm_lock(cab_lock *_Nonnull l) {
    cab_wm_maybe_preempt();
    cab_lock_lock(l);
    cab_wm_count_lock(1);
    cab_wm_acquired(l);
}

bool cab_wm_trylock(cab_lock *_Nonnull l) {
    cab_wm_maybe_preempt();
    if (!cab_lock_trylock(l)) return false;
    cab_wm_count_lock(1);
    cab_wm_acquired(l);
    return true;
}

void cab_wm_unlock(cab_lock *_Nonnull l) {
    cab_wm_enter();
    cab_wm_buffer *b = cab_wm_mine();
    cab_wm_mark *m = cab_wm_find_mark(l);
    if (b != NULL && b->count > 0) {
        if (m == NULL) {
            m = (cab_wm_mark *)malloc(sizeof(cab_wm_mark));
            if (m == NULL) abort();
            m->lock = l;
            m->next = cab_wm_marks[cab_wm_bucket(l)];
            cab_wm_marks[cab_wm_bucket(l)] = m;
        }
        m->thread = cab_wm_tid;
        m->stamp = cab_wm_at(b, b->count - 1)->stamp;
    } else if (m != NULL && !cab_wm_observer) {
        // An unmodelled thread's lock() drained the last releaser up to its
        // mark, so nothing before this unlock is pending. (An observer's
        // lock() drained nothing: its unlock leaves the mark alone.)
        m->stamp = 0;
    }
    cab_wm_leave();
    cab_wm_count_lock(-1);
    cab_lock_unlock(l);
}

/// Memory `[start, start + bytes)` is about to be freed: stores to it drain
/// (with everything older in their buffers, FIFO), and marks of mutexes in it go.
void cab_wm_forget(void *_Nonnull start, size_t bytes) {
    cab_wm_enter();
    uintptr_t low = (uintptr_t)start, high = low + bytes;
    for (intptr_t t = 0; t < CAB_WM_THREADS; t++) {
        cab_wm_buffer *b = &cab_wm_buffers[t];
        intptr_t last = -1;
        for (intptr_t i = 0; i < b->count; i++) {
            uintptr_t p = (uintptr_t)cab_wm_at(b, i)->address;
            if (p >= low && p < high) last = i;
        }
        cab_wm_drain_oldest(b, last + 1);
    }
    for (size_t k = 0; k < CAB_WM_BUCKETS; k++) {
        cab_wm_mark **link = &cab_wm_marks[k];
        while (*link != NULL) {
            uintptr_t p = (uintptr_t)(*link)->lock;
            if (p >= low && p < high) {
                cab_wm_mark *dead = *link;
                *link = dead->next;
                free(dead);
            } else {
                link = &(*link)->next;
            }
        }
    }
    cab_wm_leave();
}
