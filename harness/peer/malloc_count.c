/*
 * malloc_count.c: an LD_PRELOAD heap-counting shim for the PyTorch peer.
 *
 * densebench counts every heap allocation of its measuring process with a counting
 * `#[global_allocator]` (live bytes and their peak, the peak reset before each measured step).
 * This shim does the same for a Python/PyTorch process: it interposes glibc's allocation entry
 * points (malloc, calloc, realloc, reallocarray, free, posix_memalign, aligned_alloc, memalign,
 * valloc, pvalloc), forwards each to glibc's own implementation (`__libc_*`, so no dlsym
 * bootstrap problem), and keeps two atomics: the live bytes and their peak. PyTorch's CPU
 * allocator (c10::alloc_cpu → posix_memalign), oneDNN/MKL scratch, OpenMP, numpy and CPython
 * (objects > 512 bytes) all pass through these functions, from every thread.
 *
 * Sizes are `malloc_usable_size(p)`, not the requested size: a free() does not know the
 * requested size, and usable size is exact for what glibc hands out. It exceeds the request by
 * at most 24 bytes for heap chunks and by at most one page (4095 bytes) for the mmap-backed
 * chunks glibc uses for large blocks (>= 128 KiB by default): negligible at tensor sizes, and
 * documented in README.md.
 *
 * Not seen: memory a library maps itself with mmap (CPython's small-object arenas of 1 MiB,
 * anything else calling mmap directly). The peer's README explains why this is still the
 * comparable number and how it was checked (torch.empty of 100 MB raises the peak by 100 MB).
 *
 * Exported for ctypes (looked up in the global namespace of the preloaded process):
 *   long long mc_current(void)    live bytes now
 *   long long mc_peak(void)       highest live bytes since start or the last reset
 *   void      mc_reset_peak(void) peak := current
 *   long long mc_allocations(void) number of successful allocation calls (diagnostic)
 *   void      mc_set_limit(long long) live-byte limit (<= 0: none); also MC_LIMIT_BYTES=N;
 *                                 one shot: the first refused allocation lifts it
 *   long long mc_limit(void)      the limit in force (0 after a refusal)
 *   long long mc_refused(void)    allocations refused by the limit
 *   int       mc_installed(void)  1 (the symbol existing at all is the test)
 *
 * Build: gcc -O2 -shared -fPIC -o libmalloc_count.so malloc_count.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);

static long long current_bytes = 0;
static long long peak_bytes = 0;
static long long allocations = 0;
/* Live-byte limit; the first allocation that would pass it fails (NULL / ENOMEM), like an
 * allocation past densebench's allocator limit, and the limit is then lifted (one shot) so that
 * the process can still report the failure: Python's error handling and shutdown allocate, and
 * a process that cannot allocate at all dies with a pile of secondary errors. The refusal is
 * counted (mc_refused), so the caller can tell the limit was hit even if the failed allocation
 * was caught and retried somewhere. <= 0 means no limit. Set by mc_set_limit (or MC_LIMIT_BYTES
 * in the environment at load time). */
static long long limit_bytes = 0;
static long long refused = 0;

#define EXPORT __attribute__((visibility("default")))

/* Counts a fresh block; returns it, or NULL (block released, errno ENOMEM) past the limit. */
static inline void *account_add(void *p) {
    if (p == NULL)
        return NULL;
    long long n = (long long)malloc_usable_size(p);
    long long now = __atomic_add_fetch(&current_bytes, n, __ATOMIC_RELAXED);
    long long limit = __atomic_load_n(&limit_bytes, __ATOMIC_RELAXED);
    if (limit > 0 && now > limit) {
        __atomic_sub_fetch(&current_bytes, n, __ATOMIC_RELAXED);
        __libc_free(p);
        __atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&limit_bytes, 0, __ATOMIC_RELAXED);
        errno = ENOMEM;
        return NULL;
    }
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
    long long seen = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
    while (now > seen &&
           !__atomic_compare_exchange_n(&peak_bytes, &seen, now, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return p;
}

static inline void account_sub(void *p) {
    if (p == NULL)
        return;
    long long n = (long long)malloc_usable_size(p);
    __atomic_sub_fetch(&current_bytes, n, __ATOMIC_RELAXED);
}

EXPORT void *malloc(size_t size) {
    return account_add(__libc_malloc(size));
}

EXPORT void *calloc(size_t n, size_t size) {
    return account_add(__libc_calloc(n, size));
}

EXPORT void free(void *p) {
    account_sub(p);
    __libc_free(p);
}

EXPORT void *realloc(void *old, size_t size) {
    if (old == NULL)
        return malloc(size);
    if (size == 0) {
        free(old);
        return NULL;
    }
    long long before = (long long)malloc_usable_size(old);
    long long limit = __atomic_load_n(&limit_bytes, __ATOMIC_RELAXED);
    if (limit > 0 && (long long)size > before &&
        __atomic_load_n(&current_bytes, __ATOMIC_RELAXED) + ((long long)size - before) > limit) {
        __atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&limit_bytes, 0, __ATOMIC_RELAXED);
        errno = ENOMEM;
        return NULL; /* old block untouched, as realloc's contract says */
    }
    void *p = __libc_realloc(old, size);
    if (p == NULL)
        return NULL; /* old block untouched and still counted */
    /* Count the new block as allocated before the old one is released: a moving realloc
     * briefly holds both, and counting the growth first keeps the peak an upper bound. */
    long long after = (long long)malloc_usable_size(p);
    long long now = __atomic_add_fetch(&current_bytes, after - before, __ATOMIC_RELAXED);
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
    long long seen = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
    while (now > seen &&
           !__atomic_compare_exchange_n(&peak_bytes, &seen, now, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return p;
}

EXPORT void *reallocarray(void *old, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(old, total);
}

EXPORT void *memalign(size_t alignment, size_t size) {
    return account_add(__libc_memalign(alignment, size));
}

EXPORT void *aligned_alloc(size_t alignment, size_t size) {
    return memalign(alignment, size);
}

EXPORT int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0)
        return EINVAL;
    void *p = account_add(__libc_memalign(alignment, size));
    if (p == NULL)
        return ENOMEM;
    *out = p;
    return 0;
}

EXPORT void *valloc(size_t size) {
    return account_add(__libc_valloc(size));
}

EXPORT void *pvalloc(size_t size) {
    return account_add(__libc_pvalloc(size));
}

EXPORT long long mc_current(void) { return __atomic_load_n(&current_bytes, __ATOMIC_RELAXED); }

EXPORT long long mc_peak(void) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED); }

EXPORT void mc_reset_peak(void) {
    __atomic_store_n(&peak_bytes, __atomic_load_n(&current_bytes, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
}

EXPORT long long mc_allocations(void) {
    return __atomic_load_n(&allocations, __ATOMIC_RELAXED);
}

EXPORT void mc_set_limit(long long bytes) {
    __atomic_store_n(&limit_bytes, bytes, __ATOMIC_RELAXED);
}

EXPORT long long mc_limit(void) { return __atomic_load_n(&limit_bytes, __ATOMIC_RELAXED); }

EXPORT long long mc_refused(void) { return __atomic_load_n(&refused, __ATOMIC_RELAXED); }

EXPORT int mc_installed(void) { return 1; }

/* MC_LIMIT_BYTES=N in the environment sets the limit before main() runs. */
__attribute__((constructor)) static void mc_init(void) {
    extern char **environ;
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "MC_LIMIT_BYTES=", 15) == 0) {
            long long v = 0;
            for (const char *c = *e + 15; *c >= '0' && *c <= '9'; c++)
                v = v * 10 + (*c - '0');
            mc_set_limit(v);
        }
    }
}
