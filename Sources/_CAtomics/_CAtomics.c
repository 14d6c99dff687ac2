// Almost everything lives in include/_CAtomics.h as static inline functions.
// The ThreadSanitizer hooks below are out of line on purpose: they decide
// whether the TSan runtime is in the process, and that must not depend on
// how this file or its includers were compiled.
//
// A user turns TSan on either through SwiftPM (`swift build
// --sanitize=thread`, which also compiles this C target with
// `-fsanitize=thread`) or through the Swift compiler alone (`swift build
// -Xswiftc -sanitize=thread`, which instruments and links the runtime but
// compiles this file without TSan). `__has_feature(thread_sanitizer)` sees
// only the first, so the hooks ask the linked program instead: the TSan
// runtime defines `__tsan_ignore_thread_begin/end`, and this file refers to
// them weakly, so they are null when the runtime is absent.
#include "_CAtomics.h"
#include <stdlib.h>

// MARK: ThreadSanitizer

#if defined(__APPLE__)
// Mach-O has no weak reference to a symbol no linked library defines (the
// link would fail), and TSan's runtime is a dylib there: look it up once.
#include <dlfcn.h>

typedef void (*cab_tsan_hook)(void);
// 0: not looked up yet; 1: no runtime; otherwise the function. Racing
// first calls store the same value.
static _Atomic(uintptr_t) cab_tsan_begin_hook = 0;
static _Atomic(uintptr_t) cab_tsan_end_hook = 0;

static cab_tsan_hook cab_tsan_lookup(_Atomic(uintptr_t) *cache, const char *name) {
    uintptr_t hook = atomic_load_explicit(cache, memory_order_relaxed);
    if (hook == 0) {
        void *symbol = dlsym(RTLD_DEFAULT, name);
        hook = symbol != NULL ? (uintptr_t)symbol : 1;
        atomic_store_explicit(cache, hook, memory_order_relaxed);
    }
    return hook == 1 ? NULL : (cab_tsan_hook)hook;
}

void cab_tsan_ignore_accesses_begin(void) {
    cab_tsan_hook hook = cab_tsan_lookup(&cab_tsan_begin_hook, "__tsan_ignore_thread_begin");
    if (hook != NULL) hook();
}
void cab_tsan_ignore_accesses_end(void) {
    cab_tsan_hook hook = cab_tsan_lookup(&cab_tsan_end_hook, "__tsan_ignore_thread_end");
    if (hook != NULL) hook();
}
bool cab_tsan_is_active(void) {
    return cab_tsan_lookup(&cab_tsan_begin_hook, "__tsan_ignore_thread_begin") != NULL;
}
#else
// ELF: weak references, bound once by the linker or the dynamic loader (to
// the runtime's functions, or to null), so a call outside TSan costs a load
// and a branch not taken, nothing more.
extern void __tsan_ignore_thread_begin(void) __attribute__((weak));
extern void __tsan_ignore_thread_end(void) __attribute__((weak));

void cab_tsan_ignore_accesses_begin(void) {
    if (__tsan_ignore_thread_begin != NULL) __tsan_ignore_thread_begin();
}
void cab_tsan_ignore_accesses_end(void) {
    if (__tsan_ignore_thread_end != NULL) __tsan_ignore_thread_end();
}
bool cab_tsan_is_active(void) {
    return __tsan_ignore_thread_begin != NULL && __tsan_ignore_thread_end != NULL;
}
#endif

// MARK: Lock nesting (internal checks)

static _Thread_local intptr_t cab_shard_locks;

void cab_shard_locks_held_add(intptr_t delta) { cab_shard_locks += delta; }
intptr_t cab_shard_locks_held(void) { return cab_shard_locks; }

// MARK: Parking (the sequence gate's waiters)

// Per thread, so that a test can watch one waiter (another thread may read
// it through the address).
static _Thread_local cab_atomic_int cab_park_waits;

cab_atomic_int *_Nonnull cab_park_thread_waits(void) { return &cab_park_waits; }

// Two mechanisms. The table is compiled on every platform and is the only
// one off Linux (Apple: the gate cannot be built for it here, so the table
// is exercised on Linux instead: an internal-checks build parks on it when
// ASYNCBROADCAST_PARK_TABLE=1, and CI runs the gate's tests that way). On
// Linux, a futex.

// A fixed table of mutex/condition pairs, picked by address (parking_lot's
// shape, without the queues): a waker locks and unlocks the waiter's bucket
// after changing the word, so a waiter is either before its check (and sees
// the change) or inside `pthread_cond_wait` (and is woken).
#define CAB_PARK_BUCKETS 64
typedef struct cab_park_bucket {
    pthread_mutex_t mutex;
    pthread_cond_t condition;
    char padding[64];
} cab_park_bucket;
static cab_park_bucket cab_park_table[CAB_PARK_BUCKETS];
static pthread_once_t cab_park_once = PTHREAD_ONCE_INIT;

static void cab_park_setup(void) {
    for (int i = 0; i < CAB_PARK_BUCKETS; i++) {
        if (pthread_mutex_init(&cab_park_table[i].mutex, NULL) != 0) abort();
        if (pthread_cond_init(&cab_park_table[i].condition, NULL) != 0) abort();
    }
}

static cab_park_bucket *cab_park_bucket_for(cab_atomic_int *word) {
    pthread_once(&cab_park_once, cab_park_setup);
    uintptr_t address = (uintptr_t)word;
    return &cab_park_table[((address >> 4) ^ (address >> 12)) % CAB_PARK_BUCKETS];
}

static void cab_park_table_wait(cab_atomic_int *_Nonnull word, intptr_t expected) {
    cab_park_bucket *bucket = cab_park_bucket_for(word);
    pthread_mutex_lock(&bucket->mutex);
    if (atomic_load_explicit(&word->value, memory_order_acquire) == expected) {
        pthread_cond_wait(&bucket->condition, &bucket->mutex);
    }
    pthread_mutex_unlock(&bucket->mutex);
}

static void cab_park_table_wake(cab_atomic_int *_Nonnull word) {
    cab_park_bucket *bucket = cab_park_bucket_for(word);
    pthread_mutex_lock(&bucket->mutex);
    pthread_mutex_unlock(&bucket->mutex);
    pthread_cond_broadcast(&bucket->condition);
}

#if defined(__linux__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <errno.h>
#define CAB_PARK_HAS_FUTEX 1

// The futex compares the word's low 32 bits (little-endian: its first four
// bytes); the values parked on are small, so the high half is always 0.
_Static_assert(sizeof(intptr_t) >= sizeof(uint32_t), "a word holds a futex");

static void cab_park_futex_wait(cab_atomic_int *_Nonnull word, intptr_t expected) {
    // EAGAIN (the word changed), EINTR and spurious returns: the caller loops.
    syscall(SYS_futex, (uint32_t *)(void *)&word->value, FUTEX_WAIT_PRIVATE, (uint32_t)expected, NULL, NULL, 0);
}

static void cab_park_futex_wake(cab_atomic_int *_Nonnull word) {
    syscall(SYS_futex, (uint32_t *)(void *)&word->value, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}
#endif

// 0 until decided, then 1 (futex) or 2 (table), for the whole process: a
// waiter and its waker must use the same one.
static _Atomic intptr_t cab_park_choice;

intptr_t cab_park_mechanism(void) {
    intptr_t choice = atomic_load_explicit(&cab_park_choice, memory_order_relaxed);
    if (choice != 0) return choice;
#if defined(CAB_PARK_HAS_FUTEX)
    choice = 1;
#if defined(CAB_INTERNAL_CHECKS)
    const char *table = getenv("ASYNCBROADCAST_PARK_TABLE");
    if (table != NULL && table[0] == '1' && table[1] == 0) choice = 2;
#endif
#else
    choice = 2;
#endif
    // Every thread decides the same: a race stores the same value.
    atomic_store_explicit(&cab_park_choice, choice, memory_order_relaxed);
    return choice;
}

void cab_park_wait(cab_atomic_int *_Nonnull word, intptr_t expected) {
    atomic_fetch_add_explicit(&cab_park_waits.value, 1, memory_order_relaxed);
#if defined(CAB_PARK_HAS_FUTEX)
    if (cab_park_mechanism() == 1) {
        cab_park_futex_wait(word, expected);
        return;
    }
#endif
    cab_park_table_wait(word, expected);
}

void cab_park_wake(cab_atomic_int *_Nonnull word) {
#if defined(CAB_PARK_HAS_FUTEX)
    if (cab_park_mechanism() == 1) {
        cab_park_futex_wake(word);
        return;
    }
#endif
    cab_park_table_wake(word);
}
