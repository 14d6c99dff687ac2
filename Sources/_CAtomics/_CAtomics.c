// Almost everything lives in include/_CAtomics.h as static inline functions.
// The ThreadSanitizer hooks below are out of line on purpose: this file is
// compiled with the package's sanitizer flags (`-fsanitize=thread` under
// `swift build --sanitize=thread`), so `__has_feature(thread_sanitizer)`
// tells whether the TSan runtime is there to call.
#include "_CAtomics.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CAB_THREAD_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define CAB_THREAD_SANITIZER 1
#endif

// MARK: Asymmetric fences (see the header)

#if defined(__linux__)
#include <linux/membarrier.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

_Atomic(intptr_t) cab_asymmetric_fences = 0;

// Before main (and before any thread of ours exists): registers the process
// for expedited membarrier, and only then turns the light fence into a
// compiler barrier. `ASYNCBROADCAST_SYMMETRIC_FENCES=1` keeps full fences on
// both sides (for comparisons).
__attribute__((constructor)) static void cab_asymmetric_fences_setup(void) {
#if defined(__linux__) && defined(__NR_membarrier) && defined(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
    const char *symmetric = getenv("ASYNCBROADCAST_SYMMETRIC_FENCES");
    if (symmetric != NULL && symmetric[0] == '1') return;
    long commands = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (commands < 0 || !(commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) return;
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0) return;
    atomic_store_explicit(&cab_asymmetric_fences, 1, memory_order_relaxed);
#endif
}

void cab_thread_fence_heavy(void) {
#if defined(__linux__) && defined(__NR_membarrier) && defined(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
    if (atomic_load_explicit(&cab_asymmetric_fences, memory_order_relaxed) != 0) {
        if (syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
        // Light fences elsewhere rely on this one: going on would be a bug.
        fputs("AsyncBroadcast internal inconsistency: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after registration\n", stderr);
        abort();
    }
#endif
    atomic_thread_fence(memory_order_seq_cst);
}

bool cab_asymmetric_fences_active(void) {
    return atomic_load_explicit(&cab_asymmetric_fences, memory_order_relaxed) != 0;
}

// MARK: ThreadSanitizer

#if CAB_THREAD_SANITIZER
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);

void cab_tsan_ignore_accesses_begin(void) { __tsan_ignore_thread_begin(); }
void cab_tsan_ignore_accesses_end(void) { __tsan_ignore_thread_end(); }
bool cab_tsan_is_active(void) { return true; }
#else
void cab_tsan_ignore_accesses_begin(void) {}
void cab_tsan_ignore_accesses_end(void) {}
bool cab_tsan_is_active(void) { return false; }
#endif
