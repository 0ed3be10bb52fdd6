/*
 * rename.c — the one step of an atomic folder save (pytfm._atomic.Folder): two paths swapped
 * at once, so that a reader sees the old folder or the new one, never neither.
 */
#define _GNU_SOURCE /* syscall */

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "core/internal.h"

pytfm_status pytfm_rename_exchange(const char *a, const char *b) {
    PYTFM_CHECK(a != NULL, "%s: a must not be NULL", __func__);
    PYTFM_CHECK(b != NULL, "%s: b must not be NULL", __func__);
#if defined(__linux__) && defined(SYS_renameat2)
    enum { RENAME_EXCHANGE_FLAG = 2 }; /* linux/fs.h's RENAME_EXCHANGE; glibc >= 2.28 not needed */
    if (syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE_FLAG) == 0) {
        errno = 0;
        return PYTFM_STATUS_OK;
    }
    const int e = errno;
    const pytfm_status status =
        pytfm__fail(e == EINVAL || e == ENOSYS || e == EOPNOTSUPP ? PYTFM_STATUS_NOT_SUPPORTED
                                                                  : PYTFM_STATUS_INVALID_ARGUMENT,
                    "cannot exchange %s and %s (renameat2, errno %d)", a, b, e);
    errno = e;
    return status;
#else
    pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED, "cannot exchange %s and %s: no renameat2 here", a, b);
    errno = ENOSYS;
    return PYTFM_STATUS_NOT_SUPPORTED;
#endif
}
