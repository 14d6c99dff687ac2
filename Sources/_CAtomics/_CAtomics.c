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
