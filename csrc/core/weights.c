/*
 * weights.c — the allocation a model's weights live in.
 *
 * A decoded token reads every weight once, from memory: the weights are a stream, and how
 * fast it runs depends on the pages under it. The hardware prefetcher does not cross a page,
 * so with 4 KiB pages every 4 KiB of the stream starts cold, and a sequential read runs at
 * about half the rate it has in 2 MiB pages (docs/performance.md, "Decoding GPT-2"). So a large
 * allocation here is aligned to 2 MiB and asks Linux for transparent huge pages
 * (madvise(MADV_HUGEPAGE), before the pages are first touched: no copy, no collapse later).
 * Where that is refused or unknown (another system, THP set to "never") the memory is the same
 * memory in small pages: only the speed differs.
 */
#if defined(__linux__)
#define _DEFAULT_SOURCE /* madvise */
#include <sys/mman.h>
#endif
#include <stdint.h>
#include <stdlib.h>

#include "core/internal.h"

enum { HUGE_PAGE = 2 << 20, LINE = 64 };

void *pytfm__weights_alloc(size_t bytes) {
    if (bytes < HUGE_PAGE) // not worth a huge page: cache-line aligned, as pytfm__scratch
        return aligned_alloc(LINE, bytes == 0 ? LINE : (bytes + LINE - 1) / LINE * LINE);
    if (bytes > SIZE_MAX - HUGE_PAGE) return NULL;
    const size_t whole = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = aligned_alloc(HUGE_PAGE, whole);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p) (void)madvise(p, whole, MADV_HUGEPAGE); // a hint: refused, the pages stay small
#endif
    return p;
}
