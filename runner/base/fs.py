"""The file-system seam: every durable operation of the store goes through here.

The store never calls ``os`` for its state files directly. It calls a
:class:`FileSystem`, whose default, :class:`OsFileSystem`, is the real
operating system. Tests substitute a recording double that models what a power
loss can leave behind (see ``runner.proof.crashcheck``), so the order of writes,
fsyncs and renames is checked, not assumed.

A durable replace of a file, in the order the store performs it::

    write_file(tmp, data)   # temp file beside the target, created 0600
    fsync(tmp)              # its data is on disk before its name can be
    replace(tmp, target)    # atomic rename over the old file
    fsync_dir(folder)       # the new name itself is on disk

A durable append is ``append(path, data)`` then ``fsync(path)``. An
``overwrite(path, data)`` rewrites a file's first bytes in place; the store
uses it, without an fsync, for a witness that may lag but never leads.

Every open refuses symbolic links (``O_NOFOLLOW``), so a link planted where a
state file should be is an error, never a redirection.
"""

import contextlib
import errno
import os
import stat
import sys
import threading
from typing import Dict, Iterator, List, Optional, Tuple

from .windows import NO_OBSERVER, Observer

__all__ = ["FileSystem", "OsFileSystem", "SymlinkRefused", "replace_durably", "FILE_MODE", "DIR_MODE"]

FILE_MODE = 0o600
DIR_MODE = 0o700

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_THREAD_LOCKS_GUARD = threading.Lock()


class SymlinkRefused(OSError):
    """A state path is a symbolic link; the store refuses to follow it."""


class FileSystem:
    """The operations the store needs, by path. Subclasses implement each one.

    Reads: :meth:`read`, :meth:`read_from`, :meth:`stat`, :meth:`exists`,
    :meth:`listdir`. Durable operations: :meth:`mkdir`, :meth:`write_file`,
    :meth:`append`, :meth:`overwrite`, :meth:`fsync`, :meth:`replace`,
    :meth:`fsync_dir`, :meth:`truncate`, :meth:`unlink`. Metadata:
    :meth:`make_private`. Locking: :meth:`lock`.
    """

    def read(self, path: str) -> bytes:
        """The whole file. Raises ``FileNotFoundError`` or :class:`SymlinkRefused`."""
        raise NotImplementedError

    def read_from(self, path: str, offset: int) -> bytes:
        """The file's bytes from ``offset`` to its end."""
        return self.read(path)[offset:]

    def stat(self, path: str) -> Optional[Tuple[int, int]]:
        """``(identity, size)`` of a regular file, or None when absent.

        The identity changes when the name is pointed at another file (a
        rename over it), so a reader can tell a grown file from a new one.
        """
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def is_symlink(self, path: str) -> bool:
        raise NotImplementedError

    def listdir(self, path: str) -> List[str]:
        raise NotImplementedError

    def mkdir(self, path: str) -> None:
        """Create a directory with mode 0700."""
        raise NotImplementedError

    def write_file(self, path: str, data: bytes) -> None:
        """Create or truncate ``path`` (mode 0600) and write ``data``; no fsync."""
        raise NotImplementedError

    def create_exclusive(self, path: str, data: bytes = b"") -> None:
        """Create ``path`` (mode 0600), failing with ``FileExistsError`` if it exists."""
        raise NotImplementedError

    def append(self, path: str, data: bytes) -> None:
        """Append ``data`` to an existing file; no fsync."""
        raise NotImplementedError

    def overwrite(self, path: str, data: bytes) -> None:
        """Write ``data`` over the first bytes of an existing file, in place; no fsync."""
        raise NotImplementedError

    def fsync(self, path: str) -> None:
        """Make the file's data durable."""
        raise NotImplementedError

    def replace(self, src: str, dst: str) -> None:
        """Rename ``src`` over ``dst`` atomically; durable only after :meth:`fsync_dir`."""
        raise NotImplementedError

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creations, renames, removals) durable."""
        raise NotImplementedError

    def truncate(self, path: str, size: int) -> None:
        """Cut the file to ``size`` bytes; no fsync."""
        raise NotImplementedError

    def unlink(self, path: str) -> None:
        raise NotImplementedError

    def make_private(self, path: str) -> None:
        """Narrow an existing directory to mode 0700 (whatever it had)."""
        raise NotImplementedError

    def lock(self, path: str) -> "contextlib.AbstractContextManager[None]":
        """An exclusive lock on the file or directory at ``path``, held across processes for the ``with`` block.

        Locking needs only read access, so it works on a read-only file
        system. A missing ``path`` is created as an empty file. The store
        locks its run folder itself: a lock on a file inside could be lost to
        anyone who removes that file while it is held, after which two
        processes would hold locks on two different files of one name.
        """
        raise NotImplementedError


def replace_durably(fs: FileSystem, path: str, data: bytes, sync: bool = True,
                    observer: Observer = NO_OBSERVER) -> None:
    """Replace ``path`` with ``data`` atomically, in the order the module docstring shows.

    With ``sync`` false the fsyncs are skipped: the replace is still atomic
    for other processes, but survives only the death of a process.
    ``observer`` is told the store windows between the steps (:mod:`runner.base.windows`).
    """
    tmp = path + ".tmp"
    fs.write_file(tmp, data)
    observer.reached("store:after-temp-write", path=path)
    if sync:
        fs.fsync(tmp)
    observer.reached("store:after-temp-fsync", path=path)
    fs.replace(tmp, path)
    observer.reached("store:after-rename", path=path)
    if sync:
        fs.fsync_dir(os.path.dirname(path) or ".")
    observer.reached("store:after-rename-fsync", path=path)


def _fullfsync(fd: int) -> None:
    # On macOS fsync() does not flush the drive's cache; F_FULLFSYNC does.
    if sys.platform == "darwin":
        import fcntl

        full = getattr(fcntl, "F_FULLFSYNC", None)
        if full is not None:
            try:
                fcntl.fcntl(fd, full)
                return
            except OSError:
                pass
    os.fsync(fd)


class OsFileSystem(FileSystem):
    """The real operating system. POSIX only: locking uses ``fcntl.flock``.

    It keeps descriptors open between calls, because opening a file costs as
    much as the rest of a transition: the lock's (one per instance, so two
    stores in one process still exclude each other when each has its own
    instance), the last appended file's, reused only while the name still
    points at the same file, and the last overwritten file's.

    While it holds a lock, a name it has looked up (:meth:`stat`) is taken to
    name the same file until this object renames, removes or creates it: the
    files a lock guards change only in the hands of its holder. So an append
    and its fsync right after a look-up do not look the name up again.

    Threads: one instance may be used from several threads. :meth:`lock`
    makes the threads of this process take turns before ``flock`` (which
    would admit a second thread of the same open file), so everything done
    under the lock, a store's whole transaction, is one thread's at a time.
    """

    def __init__(self) -> None:
        self._lock_fds: Dict[str, int] = {}
        self._lock_depth: Dict[str, int] = {}
        self._thread_locks: Dict[str, "threading.RLock"] = {}
        self._append: Optional[Tuple[str, int, int]] = None  # (path, fd, inode)
        self._overwrite: Optional[Tuple[str, int, int]] = None  # (path, fd, inode)
        self._holding = 0  # locks held by this object
        self._seen: Dict[str, int] = {}  # path -> inode looked up while holding them

    def close(self) -> None:
        """Close cached descriptors (releasing any lock this instance holds)."""
        self._forget_append()
        self._forget_overwrite()
        for fd in self._lock_fds.values():
            os.close(fd)
        self._lock_fds.clear()
        self._lock_depth.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _forget_append(self, *paths: str) -> None:
        if self._append is not None and (not paths or self._append[0] in paths):
            os.close(self._append[1])
            self._append = None

    def _forget_overwrite(self, *paths: str) -> None:
        if self._overwrite is not None and (not paths or self._overwrite[0] in paths):
            os.close(self._overwrite[1])
            self._overwrite = None

    def _forget(self, *paths: str) -> None:
        self._forget_append(*paths)
        self._forget_overwrite(*paths)
        for path in paths:
            self._seen.pop(path, None)

    def _open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        try:
            return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
        except OSError as exc:
            if exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and os.path.islink(path)):
                raise SymlinkRefused(errno.ELOOP, "refusing to follow a symbolic link", path) from None
            raise

    def read(self, path: str) -> bytes:
        return self.read_from(path, 0)

    def read_from(self, path: str, offset: int) -> bytes:
        fd = self._open(path, os.O_RDONLY)
        try:
            chunks: List[bytes] = []
            if offset:
                os.lseek(fd, offset, os.SEEK_SET)
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(fd)

    def stat(self, path: str) -> Optional[Tuple[int, int]]:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise SymlinkRefused(errno.ELOOP, "refusing to follow a symbolic link", path)
        if self._holding:
            self._seen[path] = st.st_ino
        return (st.st_ino, st.st_size)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def is_symlink(self, path: str) -> bool:
        return os.path.islink(path)

    def listdir(self, path: str) -> List[str]:
        return sorted(os.listdir(path))

    def mkdir(self, path: str) -> None:
        os.mkdir(path, DIR_MODE)
        os.chmod(path, DIR_MODE)  # the umask may have narrowed or widened it

    def make_private(self, path: str) -> None:
        fd = self._open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)

    def write_file(self, path: str, data: bytes) -> None:
        self._forget(path)
        fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def create_exclusive(self, path: str, data: bytes = b"") -> None:
        self._forget(path)
        fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def _append_fd(self, path: str) -> int:
        ino = self._seen.get(path)
        if ino is None:
            ino = os.lstat(path).st_ino
        cached = self._append
        if cached is not None and cached[0] == path and cached[2] == ino:
            return cached[1]
        self._forget_append()
        fd = self._open(path, os.O_WRONLY | os.O_APPEND)
        self._append = (path, fd, os.fstat(fd).st_ino)
        return fd

    def append(self, path: str, data: bytes) -> None:
        _write_all(self._append_fd(path), data)

    def overwrite(self, path: str, data: bytes) -> None:
        # One cached descriptor, kept until this object renames, removes or
        # recreates the file. Unlike an append's, it is not checked against the
        # name on every call: the caller (the store's head witness) may lose a
        # write to a file someone else replaced, and loses nothing by it.
        cached = self._overwrite
        if cached is None or cached[0] != path:
            self._forget_overwrite()
            fd = self._open(path, os.O_WRONLY)
            cached = self._overwrite = (path, fd, os.fstat(fd).st_ino)
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            offset += os.pwrite(cached[1], view[offset:], offset)

    def fsync(self, path: str) -> None:
        cached = self._append
        if cached is not None and cached[0] == path:
            _fullfsync(self._append_fd(path))
            return
        fd = self._open(path, os.O_RDONLY)
        try:
            _fullfsync(fd)
        finally:
            os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        self._forget(src, dst)
        os.replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        try:
            _fullfsync(fd)
        finally:
            os.close(fd)

    def truncate(self, path: str, size: int) -> None:
        fd = self._open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def unlink(self, path: str) -> None:
        self._forget(path)
        os.unlink(path)

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            raise OSError(errno.ENOSYS, "the run store needs fcntl.flock (POSIX); this platform has none") from None
        # Threads of this process take turns first (flock would let a second thread of the same open
        # file in), so the depth below counts one thread's nested holds, never two threads' holds.
        with self._thread_lock(path):
            fd = self._lock_fds.get(path)
            if fd is None:
                try:
                    fd = self._open(path, os.O_RDONLY)  # a folder, or a file that exists: read access is enough
                except FileNotFoundError:
                    fd = self._open(path, os.O_RDWR | os.O_CREAT)
                self._lock_fds[path] = fd
            depth = self._lock_depth.get(path, 0)
            if depth == 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._holding += 1
                self._seen.clear()  # what was looked up before belongs to no hold of this lock
            self._lock_depth[path] = depth + 1
            try:
                yield
            finally:
                self._lock_depth[path] -= 1
                if self._lock_depth[path] == 0:
                    self._holding -= 1
                    self._seen.clear()  # names looked up under the lock may change once it is released
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def _thread_lock(self, path: str) -> "threading.RLock":
        with _THREAD_LOCKS_GUARD:
            found = self._thread_locks.get(path)
            if found is None:
                found = self._thread_locks[path] = threading.RLock()
            return found


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
