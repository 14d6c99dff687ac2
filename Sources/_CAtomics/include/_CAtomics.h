// _CAtomics: the only synchronization primitives AsyncBroadcast uses.
//
// C11 <stdatomic.h> and an OS mutex behind `static inline` functions, so the
// Swift library can run where the `Synchronization` module is unavailable
// (before macOS 15 / iOS 18) and so ThreadSanitizer sees every
// synchronization edge (it does not see Synchronization.Mutex's futex on
// Linux). Every operation names its memory order.
//
// Underscored, like swift-atomics' `_AtomicsShims`, because it is not API:
// AsyncBroadcast imports it publicly only so that its `@inlinable` wrappers
// (`AtomicInt`, `Lock`, `AtomicBlock`) can call these functions, which puts
// them, inlined, in the clients' specializations of the generic hot paths.
// Clients must not import it; it may change with any release.
//
// Objects are heap-allocated here and handed to Swift as pointers: Swift must
// never move an atomic or a mutex, and a C allocation has a stable address.
#ifndef ASYNCBROADCAST_CATOMICS_H
#define ASYNCBROADCAST_CATOMICS_H


#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#if defined(__APPLE__)
#include <os/lock.h>
#endif
#include <pthread.h>

// MARK: - Atomic word

typedef struct cab_atomic_int {
    _Atomic(intptr_t) value;
} cab_atomic_int;

static inline cab_atomic_int *_Nonnull cab_atomic_int_create(intptr_t initial) {
    cab_atomic_int *a = (cab_atomic_int *)malloc(sizeof(cab_atomic_int));
    if (a == NULL) abort();
    atomic_init(&a->value, initial);
    return a;
}

static inline void cab_atomic_int_destroy(cab_atomic_int *_Nonnull a) { free(a); }

static inline intptr_t cab_atomic_int_load_relaxed(cab_atomic_int *_Nonnull a) {
    return atomic_load_explicit(&a->value, memory_order_relaxed);
}

static inline intptr_t cab_atomic_int_load_acquire(cab_atomic_int *_Nonnull a) {
    return atomic_load_explicit(&a->value, memory_order_acquire);
}

static inline intptr_t cab_atomic_int_load_seq_cst(cab_atomic_int *_Nonnull a) {
    return atomic_load_explicit(&a->value, memory_order_seq_cst);
}

static inline void cab_atomic_int_store_relaxed(cab_atomic_int *_Nonnull a, intptr_t v) {
    atomic_store_explicit(&a->value, v, memory_order_relaxed);
}

static inline void cab_atomic_int_store_release(cab_atomic_int *_Nonnull a, intptr_t v) {
    atomic_store_explicit(&a->value, v, memory_order_release);
}

static inline void cab_atomic_int_store_seq_cst(cab_atomic_int *_Nonnull a, intptr_t v) {
    atomic_store_explicit(&a->value, v, memory_order_seq_cst);
}

static inline intptr_t cab_atomic_int_exchange_acq_rel(cab_atomic_int *_Nonnull a, intptr_t v) {
    return atomic_exchange_explicit(&a->value, v, memory_order_acq_rel);
}

/// Strong compare-exchange. Returns true on success; on failure `*expected`
/// receives the current value.
static inline bool cab_atomic_int_cas_acq_rel(cab_atomic_int *_Nonnull a,
                                              intptr_t *_Nonnull expected,
                                              intptr_t desired) {
    return atomic_compare_exchange_strong_explicit(
        &a->value, expected, desired, memory_order_acq_rel, memory_order_acquire);
}

static inline intptr_t cab_atomic_int_fetch_or_acq_rel(cab_atomic_int *_Nonnull a, intptr_t v) {
    return atomic_fetch_or_explicit(&a->value, v, memory_order_acq_rel);
}

static inline intptr_t cab_atomic_int_fetch_add_relaxed(cab_atomic_int *_Nonnull a, intptr_t v) {
    return atomic_fetch_add_explicit(&a->value, v, memory_order_relaxed);
}

static inline intptr_t cab_atomic_int_fetch_add_acq_rel(cab_atomic_int *_Nonnull a, intptr_t v) {
    return atomic_fetch_add_explicit(&a->value, v, memory_order_acq_rel);
}

static inline intptr_t cab_atomic_int_fetch_sub_acq_rel(cab_atomic_int *_Nonnull a, intptr_t v) {
    return atomic_fetch_sub_explicit(&a->value, v, memory_order_acq_rel);
}

/// A full sequentially consistent fence: orders a preceding store before a
/// following load (the store-buffering pattern of a park/wake hand-off).
static inline void cab_thread_fence_seq_cst(void) {
    atomic_thread_fence(memory_order_seq_cst);
}

// MARK: - Hints
//
// For the sequence lock's waiters (`SequenceGate`: a request spins a
// counted number of times before it blocks) and a send's walk over many
// subscribers.

/// One spin-loop hint (x86 `pause`, arm64 `yield`): tells the core that this
/// thread waits, so a sibling hyperthread runs and the loop leaves no
/// speculated loads to unwind when the word changes.
static inline void cab_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

/// A hint to bring the cache line at `address` in for writing (a send's
/// loop asks for subscribers it will reach a few iterations later). Never
/// faults, orders nothing.
static inline void cab_prefetch_for_write(const void *_Nullable address) {
    __builtin_prefetch(address, 1, 3);
}

/// Gives the CPU to another runnable thread (sched_yield).
static inline void cab_thread_yield(void) { (void)sched_yield(); }

/// Sleeps about `nanos` (at least; Linux adds its timer slack, 50 µs by
/// default): off the run queue, unlike a yield, so a thread waiting to run
/// on this core gets it, and this one, woken, is not placed behind the
/// threads that kept running.
static inline void cab_thread_sleep(int64_t nanos) {
    struct timespec duration = { (time_t)(nanos / 1000000000), (long)(nanos % 1000000000) };
    nanosleep(&duration, NULL);
}

/// Processors online (at least 1).
static inline intptr_t cab_processor_count(void) {
    long count = sysconf(_SC_NPROCESSORS_ONLN);
    return count > 0 ? (intptr_t)count : 1;
}

/// A monotonic clock in nanoseconds, for bounding waits in time (a vDSO
/// call on Linux, no system call).
static inline int64_t cab_monotonic_nanos(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + (int64_t)now.tv_nsec;
}

// MARK: - Mutex
//
// A real OS lock (pthread mutex / os_unfair_lock): waiters sleep in the
// kernel instead of spinning on the cooperative pool.

typedef struct cab_lock {
#if defined(__APPLE__)
    os_unfair_lock lock;
#else
    pthread_mutex_t lock;
#endif
} cab_lock;

static inline void cab_lock_init(cab_lock *_Nonnull l) {
#if defined(__APPLE__)
    l->lock = OS_UNFAIR_LOCK_INIT;
#else
    // Critical sections here are a few dozen instructions, so a contended
    // lock is released almost at once: glibc's adaptive mutex spins a
    // bounded number of times before sleeping in the kernel, which saves a
    // futex round trip per contended acquisition.
    pthread_mutexattr_t attributes;
    pthread_mutexattr_init(&attributes);
#if defined(__GLIBC__)
    // PTHREAD_MUTEX_ADAPTIVE_NP (3 in glibc's ABI); spelled as a number
    // because the enumerator is hidden unless _GNU_SOURCE reached the
    // (precompiled) Glibc module.
    pthread_mutexattr_settype(&attributes, 3);
#endif
    if (pthread_mutex_init(&l->lock, &attributes) != 0) abort();
    pthread_mutexattr_destroy(&attributes);
#endif
}

static inline void cab_lock_deinit(cab_lock *_Nonnull l) {
#if !defined(__APPLE__)
    pthread_mutex_destroy(&l->lock);
#else
    (void)l;
#endif
}

static inline cab_lock *_Nonnull cab_lock_create(void) {
    cab_lock *l = (cab_lock *)malloc(sizeof(cab_lock));
    if (l == NULL) abort();
    cab_lock_init(l);
    return l;
}

static inline void cab_lock_destroy(cab_lock *_Nonnull l) {
    cab_lock_deinit(l);
    free(l);
}

static inline void cab_lock_lock(cab_lock *_Nonnull l) {
#if defined(__APPLE__)
    os_unfair_lock_lock(&l->lock);
#else
    if (pthread_mutex_lock(&l->lock) != 0) abort();
#endif
}

static inline void cab_lock_unlock(cab_lock *_Nonnull l) {
#if defined(__APPLE__)
    os_unfair_lock_unlock(&l->lock);
#else
    if (pthread_mutex_unlock(&l->lock) != 0) abort();
#endif
}

// `true` if the lock was free and is now held by the caller.
static inline bool cab_lock_trylock(cab_lock *_Nonnull l) {
#if defined(__APPLE__)
    return os_unfair_lock_trylock(&l->lock);
#else
    return pthread_mutex_trylock(&l->lock) == 0;
#endif
}

// MARK: - Parking a thread on a word (defined in _CAtomics.c)
//
// For the sequence gate's waiters (`SequenceGate`): a thread whose request
// waits blocks on a word of its own request node until the lock's holder
// changes it. Linux: a private futex on the word's low 32 bits (the values
// parked on are small). Elsewhere: a fixed table of mutex/condition pairs
// picked by the word's address (never freed, so a waker may touch its entry
// after the waiter returned and its node is gone).

/// Blocks while `*word == expected` (returns at once if not; may return
/// spuriously: callers loop).
void cab_park_wait(cab_atomic_int *_Nonnull word, intptr_t expected);
/// Wakes the threads blocked on `word` by `cab_park_wait`. Call after
/// changing the word. `word` may be memory its waiter has already given up.
void cab_park_wake(cab_atomic_int *_Nonnull word);
/// How this process parks: 1 a Linux futex, 2 the mutex/condition table
/// (off Linux; on Linux in a build with the internal checks run with
/// ASYNCBROADCAST_PARK_TABLE=1, so that the table is tested here).
intptr_t cab_park_mechanism(void);
/// The calling thread's count of `cab_park_wait` calls (it may be read from
/// other threads through this address while the thread lives).
cab_atomic_int *_Nonnull cab_park_thread_waits(void);

// MARK: - Lock nesting (internal checks)
//
// The rule "nobody waits for a sequence lock while holding a topic shard's
// lock" is checked, in builds with the library's internal checks, by a
// per-thread count of the shard locks held: the sequence lock traps when it
// is taken with the count above zero, whether or not it would have waited.

/// Adds `delta` (+1 taken, -1 released) to the calling thread's count of
/// topic shard locks held.
void cab_shard_locks_held_add(intptr_t delta);
/// The calling thread's count of topic shard locks held.
intptr_t cab_shard_locks_held(void);

// MARK: - Thread identity
//
// A non-zero word naming the calling thread, unique among live threads: lets
// a lock's holder record itself so that a re-entrant call from the same
// thread traps with a message instead of deadlocking.
static inline intptr_t cab_current_thread_id(void) {
    return (intptr_t)pthread_self();
}

// MARK: - Block: a lock, atomic words and extra bytes in one allocation
//
// An object that needs a lock and several atomics (a subscriber needs one
// lock and a few dozen words) gets them from one malloc instead of one each,
// which is most of the cost of subscribing. Layout, 64-byte aligned:
//   line 0: the mutex;  line k >= 1: words [8(k-1), 8k);
//   then, from the next multiple of `extra_alignment`, `extra_bytes` bytes
//   for the owner (a subscriber's first ring segment).
// The caller chooses word indices so that words written by different
// threads sit on different cache lines. Every word starts at 0; the extra
// bytes start uninitialized.

#define CAB_BLOCK_LINE 64
// The mutex, then (last in line 0) the block's size and the address malloc
// returned.
#define CAB_BLOCK_ORIGIN_OFFSET (CAB_BLOCK_LINE - (intptr_t)sizeof(void *))
#define CAB_BLOCK_SIZE_OFFSET (CAB_BLOCK_ORIGIN_OFFSET - (intptr_t)sizeof(size_t))
_Static_assert(sizeof(cab_lock) <= CAB_BLOCK_SIZE_OFFSET, "the mutex must fit in line 0");

typedef struct cab_block cab_block;

/// Offset of the extra bytes. `extra_alignment` is a power of two.
static inline size_t cab_block_extra_offset(intptr_t word_count, intptr_t extra_alignment) {
    size_t words_end = (size_t)(1 + (word_count + 7) / 8) * CAB_BLOCK_LINE;
    size_t alignment = (size_t)extra_alignment;
    return (words_end + alignment - 1) & ~(alignment - 1);
}

// Aligned by hand from a plain malloc, not with aligned_alloc: glibc's
// memalign path allocates more, splits the chunk and frees the slack on
// every call, which made it the dearer half of a subscribe + cancel cycle.
static inline cab_block *_Nonnull cab_block_create_extra(intptr_t word_count, intptr_t extra_bytes,
                                                        intptr_t extra_alignment) {
    intptr_t word_lines = (word_count + 7) / 8;
    size_t alignment = extra_alignment > CAB_BLOCK_LINE ? (size_t)extra_alignment : CAB_BLOCK_LINE;
    size_t size = cab_block_extra_offset(word_count, extra_alignment) + (size_t)extra_bytes;
    char *origin = (char *)malloc(size + alignment - 1);
    if (origin == NULL) abort();
    char *memory = (char *)(((uintptr_t)origin + alignment - 1) & ~(uintptr_t)(alignment - 1));
    *(char **)(memory + CAB_BLOCK_ORIGIN_OFFSET) = origin;
    *(size_t *)(memory + CAB_BLOCK_SIZE_OFFSET) = size;
    cab_lock *lock = (cab_lock *)memory;
    cab_lock_init(lock);
    cab_atomic_int *words = (cab_atomic_int *)(memory + CAB_BLOCK_LINE);
    for (intptr_t i = 0; i < word_lines * 8; i++) atomic_init(&words[i].value, 0);
    return (cab_block *)memory;
}

static inline cab_block *_Nonnull cab_block_create(intptr_t word_count) {
    return cab_block_create_extra(word_count, 0, 1);
}

static inline cab_lock *_Nonnull cab_block_lock(cab_block *_Nonnull block) {
    return (cab_lock *)block;
}

static inline cab_atomic_int *_Nonnull cab_block_word(cab_block *_Nonnull block, intptr_t index) {
    return (cab_atomic_int *)((char *)block + CAB_BLOCK_LINE) + index;
}

/// The extra bytes of a block created with the same `word_count` and
/// `extra_alignment`.
static inline void *_Nonnull cab_block_extra(cab_block *_Nonnull block, intptr_t word_count,
                                             intptr_t extra_alignment) {
    return (char *)block + cab_block_extra_offset(word_count, extra_alignment);
}

/// Bytes from the block's start to the end of its extra bytes.
static inline size_t cab_block_size(cab_block *_Nonnull block) {
    return *(size_t *)((char *)block + CAB_BLOCK_SIZE_OFFSET);
}

static inline void cab_block_destroy(cab_block *_Nonnull block) {
    cab_lock_deinit(cab_block_lock(block));
    free(*(char **)((char *)block + CAB_BLOCK_ORIGIN_OFFSET));
}

// MARK: - ThreadSanitizer (defined in _CAtomics.c)
//
// Between these two calls the current thread's memory accesses are not
// recorded by ThreadSanitizer (its synchronisation still is); in a process
// without the TSan runtime they do nothing. Used only around
// `UnsafeContinuation.resume()`: see `Parking.resume` for why. Whether the
// runtime is there is decided when the program runs, not from how this shim
// was compiled (see _CAtomics.c).
void cab_tsan_ignore_accesses_begin(void);
void cab_tsan_ignore_accesses_end(void);
/// Whether the ThreadSanitizer runtime is in this process, so the two hooks
/// above act (for tests and the client check).
bool cab_tsan_is_active(void);

// MARK: - Weak-memory model (defined in WeakMemory.c)
//
// Used only by builds with `ASYNCBROADCAST_WEAK_MEMORY=1` (the deterministic
// checkers): `AtomicInt` and `Lock` then call these instead of the inline
// functions above, and the harness decides when each logical thread's
// buffered stores become visible. See WeakMemory.c for the model.

#define CAB_WM_THREADS 128
#define CAB_WM_RELAXED 0
#define CAB_WM_ACQUIRE 1
#define CAB_WM_SEQ_CST 2

void cab_wm_enable(bool on);
bool cab_wm_is_enabled(void);
/// The calling OS thread's logical thread (0 ..< CAB_WM_THREADS), or -1:
/// unmodelled, straight to memory.
void cab_wm_set_thread(intptr_t thread);
intptr_t cab_wm_thread(void);
/// While on, loads see the newest store anyone made and nothing drains: the
/// checker's own look at the state.
void cab_wm_set_observer(bool on);
/// Makes the oldest `count` (all, if negative) of `thread`'s stores visible.
void cab_wm_drain(intptr_t thread, intptr_t count);
void cab_wm_drain_all(void);
intptr_t cab_wm_pending(intptr_t thread);
/// Stores buffered so far, and loads that read memory while another thread
/// had a newer store to the word buffered.
void cab_wm_statistics(uint64_t *_Nonnull buffered, uint64_t *_Nonnull stale);

intptr_t cab_wm_load(cab_atomic_int *_Nonnull a, intptr_t order);
void cab_wm_store(cab_atomic_int *_Nonnull a, intptr_t value, intptr_t order);
intptr_t cab_wm_exchange(cab_atomic_int *_Nonnull a, intptr_t value);
bool cab_wm_cas(cab_atomic_int *_Nonnull a, intptr_t *_Nonnull expected, intptr_t desired);
intptr_t cab_wm_fetch_add(cab_atomic_int *_Nonnull a, intptr_t delta);
intptr_t cab_wm_fetch_or(cab_atomic_int *_Nonnull a, intptr_t bits);
void cab_wm_fence(void);
/// Synchronisation the Swift runtime does for us (a continuation's resume).
void cab_wm_runtime_sync(void);
void cab_wm_lock(cab_lock *_Nonnull l);
bool cab_wm_trylock(cab_lock *_Nonnull l);
void cab_wm_unlock(cab_lock *_Nonnull l);
/// The orderings a checker removed at run time (bits of
/// `WeakMemoryModel.Ordering`; see FaultInjection.swift).
intptr_t cab_wm_faults(void);
void cab_wm_set_faults(intptr_t bits);
/// Called before each operation of a modelled thread holding none of our
/// locks (never nested): the harness may run another logical thread there.
void cab_wm_set_preempt_hook(void (*_Nullable hook)(void));
/// A lock that is not a `cab_lock` (the sequence gate) was taken (+1) or
/// released (-1) by the calling thread: no preemption point while held, as
/// for `cab_wm_lock`.
void cab_wm_note_lock(intptr_t delta);
/// A lock made of one word: its release, a compare-exchange that leaves the
/// caller's earlier stores buffered up to a mark (as `cab_wm_unlock`), and
/// its acquisition, after which the last releaser's stores up to its mark
/// are visible (as `cab_wm_lock`).
bool cab_wm_cas_release(cab_atomic_int *_Nonnull a, intptr_t *_Nonnull expected, intptr_t desired);
void cab_wm_word_lock_acquired(cab_atomic_int *_Nonnull a);
/// Before freeing `[start, start + bytes)`.
void cab_wm_forget(void *_Nonnull start, size_t bytes);

#endif /* ASYNCBROADCAST_CATOMICS_H */
