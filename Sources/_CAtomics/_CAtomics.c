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
