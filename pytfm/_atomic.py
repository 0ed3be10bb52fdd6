"""pytfm._atomic — the one atomic writer: a file, or a folder, replaced as a whole. A reader,
and a writer killed at any moment, see the old version or the new one, never a mix.

A file (write_file): its bytes go to a new temporary beside it, .tmp-<name>.<8 hex digits>
(unique to this writer: no other thread or process picks the same name), which the writer
holds locked (flock) while it sets the mode of the file it replaces (before any byte, so that
a private file's bytes are never readable; a new file gets 0666 less the umask), writes,
fsyncs and renames it over the file; then the folder is fsynced so that the rename survives a
crash. A writer killed midway leaves its temporary unlocked (the kernel drops a dead process's
locks): the next save of the same file removes each one it can lock, and so never one a
running save holds. A symlink at the path is replaced by the file (its target is left as it
was), which takes the target's mode.

A folder (Folder): every save of it, in any thread or process, holds <parent>/.<name>.lock
(flock), so that two saves never interleave. Under it the save removes what killed saves left
(.tmp-<name>.dir-*), then builds the new folder as a sibling .tmp-<name>.dir-<16 hex digits>:
the files written, each with the mode of the file of that name it replaces; every other entry
of the old folder that was not removed (Folder.remove) carried over (hard-linked, copied where
a link is refused); the folder's own mode kept; all of it fsynced. Then one step swaps it with
the folder (renameat2's RENAME_EXCHANGE, pytfm_rename_exchange) and the old one, now under the
temporary name, is removed. A file system that cannot exchange (NFS, say) gets two renames
instead: the old folder aside to .tmp-<name>.old-<hex>, the new one into place. A save killed
between them leaves the folder missing and the old one aside, and the next save puts it back
before anything else.
A folder given as a symlink is saved where the link points.

The folder is a new one after the save (a new inode): a process whose working folder it was
stays in the old, removed one (this process is moved to the new one), and a file created in it
by someone else while the save runs is lost. Files open elsewhere keep writing into the new
folder's: a carried-over file is the same file (a hard link), unless it had to be copied.
"""

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import stat

from ._core import check, lib


def _prefix(path):
    """.tmp-<name>. : what the temporaries of path start with. A long name is cut (with a hash
    of the whole) so that every temporary's name stays under NAME_MAX (255 bytes)."""
    base = os.path.basename(path)
    if len(base) > 50:
        base = base[:40] + "~" + hashlib.sha256(os.fsencode(base)).hexdigest()[:8]
    return f".tmp-{base}."


def _mode_of(path):
    """The permission bits of the file at path (a symlink's target's), or None when there is
    none."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def _write_chunks(fd, data, mode):
    """Set mode (None: keep the umask's), write data (bytes, or an iterable of them) and fsync;
    fd is closed."""
    with os.fdopen(fd, "wb") as f:
        if mode is not None:
            os.fchmod(f.fileno(), mode)  # before the data: a private file's bytes stay private
        for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def fsync_folder(folder):
    """Make the entries made in folder durable (POSIX leaves that to an fsync of the folder)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system without folder fsync
            raise
    finally:
        os.close(fd)


# ---- one file -------------------------------------------------------------------------------


def write_file(path, data):
    """Replace the file at path with data (bytes, or an iterable of bytes) atomically, as the
    module says. The temporary is removed if anything fails."""
    folder = os.path.dirname(os.path.abspath(path))
    _remove_stale_temporaries(path)
    mode = _mode_of(path)
    fd, tmp = _create_temporary(path)
    try:
        lock = os.dup(fd)  # held past _write_chunks' close, until the rename is done
        try:
            _write_chunks(fd, data, mode)
            os.replace(tmp, path)
        finally:
            os.close(lock)
        fsync_folder(folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create_temporary(path):
    """-> (fd, name) of a new, empty, locked temporary file next to path."""
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        tmp = os.path.join(folder, _prefix(path) + secrets.token_hex(4))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # a cleaner may have locked and removed it between the open and the lock
            ours = os.path.samestat(os.stat(tmp), os.fstat(fd))
        except FileNotFoundError:
            ours = False
        except OSError:
            ours = True  # no locks on this file system: then no cleaner removes anything either
        if ours:
            return fd, tmp
        os.close(fd)


def _remove_stale_temporaries(path):
    """Remove the temporaries of path that killed saves left: those no running save holds."""
    folder, prefix = os.path.dirname(os.path.abspath(path)), _prefix(path)
    for entry in os.listdir(folder):
        if not (entry.startswith(prefix) and re.fullmatch("[0-9a-f]{8}", entry[len(prefix):])):
            continue
        tmp = os.path.join(folder, entry)
        try:  # O_RDWR: NFS emulates flock with fcntl locks, whose LOCK_EX needs a writable fd
            fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile, or not ours to touch
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a save holds it
            if os.path.samestat(os.stat(tmp), os.fstat(fd)):
                os.unlink(tmp)
        except OSError:
            pass  # held by a running save (or no locks here): leave it
        finally:
            os.close(fd)


# ---- a folder -------------------------------------------------------------------------------


class Folder:
    """A save of the folder at path, atomic as a whole (the module says how):

        with Folder(path) as f:
            f.write("config.json", text.encode())
            f.write("model.safetensors", chunks)

    replaces the folder (made if missing) on a clean exit, keeping the entries of the old one
    that were neither written nor removed (f.remove(name)), and leaves it as it was when the
    block raises."""

    def __init__(self, path):
        self.path = os.path.realpath(path)
        self.parent = os.path.dirname(self.path)
        self.written, self.removed = set(), set()
        self._lock = self._tmp = None

    def _name(self, name):
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(f"name must be a file name without a folder, got {name!r}")
        if name in self.written or name in self.removed:
            raise ValueError(f"{name} is written or removed twice in one save of {self.path}")

    def write(self, name, data):
        """Write data (bytes, or an iterable of bytes) as the file name, a plain file name,
        with the mode of the old folder's file of that name (0666 less the umask for a new
        one)."""
        self._name(name)
        fd = os.open(os.path.join(self._tmp, name),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        self.written.add(name)
        _write_chunks(fd, data, _mode_of(os.path.join(self.path, name)))

    def remove(self, name):
        """Leave the old folder's entry name (if any) out of the new folder."""
        self._name(name)
        self.removed.add(name)

    def __enter__(self):
        prefix = os.path.join(self.parent, _prefix(self.path))
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", self.path)
        os.makedirs(self.parent, exist_ok=True)
        self._lock = os.open(os.path.join(self.parent, f".{_prefix(self.path)[5:]}lock"),
                             os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            self._remove_stale()
            self._tmp = prefix + "dir-" + secrets.token_hex(8)
            os.mkdir(self._tmp, 0o777)
            if os.path.isdir(self.path):  # a private folder's files are never readable
                os.chmod(self._tmp, stat.S_IMODE(os.stat(self.path).st_mode))
        except BaseException:
            os.close(self._lock)
            raise
        return self

    def __exit__(self, kind, value, traceback):
        try:
            if kind is None:
                self._commit()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)  # the new one left, or the old one
            os.close(self._lock)

    def _remove_stale(self):
        """Under the lock, no other save runs: what killed ones left is stale. A folder set
        aside by a save killed before the new one took its place is put back."""
        prefix = _prefix(self.path)
        for entry in os.listdir(self.parent):
            kind = re.fullmatch(re.escape(prefix) + "(dir|old)-[0-9a-f]{16}", entry)
            stale = os.path.join(self.parent, entry)
            if kind and kind[1] == "old" and not os.path.lexists(self.path):
                os.rename(stale, self.path)
            elif kind:
                shutil.rmtree(stale, ignore_errors=True)

    def _commit(self):
        old = os.path.isdir(self.path)
        if old:
            self._carry_over()
        _fsync_tree(self._tmp)
        if not old:
            os.rename(self._tmp, self.path)
        else:
            status = lib.pytfm_rename_exchange(os.fsencode(self._tmp), os.fsencode(self.path))
            if status == lib.PYTFM_STATUS_OK:
                pass
            elif status == lib.PYTFM_STATUS_NOT_SUPPORTED:
                aside = self._tmp.replace(".dir-", ".old-")
                os.rename(self.path, aside)
                try:
                    os.rename(self._tmp, self.path)
                except BaseException:
                    os.rename(aside, self.path)
                    raise
                self._tmp = aside
            else:
                check(status, OSError)
        fsync_folder(self.parent)
        with contextlib.suppress(OSError):
            if os.path.samestat(os.stat("."), os.stat(self._tmp)):  # we were in the old one
                os.chdir(self.path)

    def _carry_over(self):
        """Every entry of the old folder not written nor removed: hard-linked (a folder's tree
        linked file by file), copied where a link is refused; a symlink as a symlink."""
        for entry in os.scandir(self.path):
            if entry.name in self.written or entry.name in self.removed:
                continue
            src, dst = entry.path, os.path.join(self._tmp, entry.name)
            if entry.is_dir(follow_symlinks=False):
                shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
            elif entry.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:
                _link_or_copy(src, dst)


def _link_or_copy(src, dst):
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)
        if not os.path.islink(dst):
            fd = os.open(dst, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return dst


def _fsync_tree(top):
    for folder, _, _ in os.walk(top):
        fsync_folder(folder)


def writing(folder):
    """A context manager for a save into folder: an open Folder is written into as it is (the
    caller commits it), a path gets a Folder of its own."""
    return contextlib.nullcontext(folder) if isinstance(folder, Folder) else Folder(folder)
