"""The recording file system: the store's :class:`~runner.base.fs.FileSystem`, in memory, under the persistence model.

It keeps, beside what a process would read, what the disk is guaranteed to
hold (:mod:`runner.proof.crash_model`), and logs every durable operation, so
the explorer (:mod:`runner.proof.crashcheck`) can ask after each one which
states a power loss at that moment could leave.
"""

import contextlib
import errno
import functools
import os
import posixpath
import random
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple, Type

from ..base.fs import FileSystem
from .crash_model import CrashSpace, Tree, _Change, _content_options, _Dir, _File, _Node

__all__ = ["LogEntry", "RecordingFileSystem"]


class LogEntry(NamedTuple):
    """One line of the operation log.

    ``kind`` is ``"op"`` for a durable operation of the file system (``name``
    is the method) or ``"mark"`` for a workload annotation (``name`` is the
    marker: ``attempt``, ``ack``, ``damage`` ...). ``detail`` holds the rename
    target, the byte count, or the marker's value.
    """

    kind: str
    name: str
    path: str
    detail: Any

    def describe(self) -> str:
        if self.kind == "mark":
            return f"{self.name} {self.detail!r}" + (f" {self.path}" if self.path else "")
        if self.name == "replace":
            return f"replace {self.path} -> {self.detail}"
        if self.name in ("write_file", "create_exclusive", "append", "overwrite"):
            return f"{self.name} {self.path} ({self.detail} bytes)"
        if self.name == "truncate":
            return f"truncate {self.path} to {self.detail}"
        return f"{self.name} {self.path}"



def _oserror(cls: Type[OSError], code: int, path: str) -> OSError:
    return cls(code, os.strerror(code), path)


@functools.lru_cache(maxsize=4096)
def _parts(path: str) -> Tuple[str, ...]:
    # Relative paths resolve against the root, the model's only working directory. Cached: an
    # exploration resolves the same few dozen paths hundreds of thousands of times.
    norm = posixpath.normpath(posixpath.join("/", path))
    return tuple(part for part in norm.split("/") if part)


class RecordingFileSystem(FileSystem):
    """An in-memory :class:`~runner.base.fs.FileSystem` that records durable operations.

    It behaves as the operating system does for everything the store uses:
    missing paths raise ``FileNotFoundError``, exclusive creation of an
    existing name ``FileExistsError``, a directory where a file is expected
    ``IsADirectoryError`` and so on. There are no symbolic links, and
    :meth:`lock` is a no-op because a single process drives it.

    Every successful durable operation is appended to :attr:`log` and then
    reported to :attr:`observer`, which can take the crash states of that
    moment with :meth:`crash_space`. :meth:`mark` adds workload annotations;
    :meth:`damage` changes a file's bytes behind the store's back.
    """

    def __init__(self, observer: Optional[Callable[["RecordingFileSystem"], None]] = None) -> None:
        self._nodes: Dict[int, _Node] = {}
        self._next_ino = 1
        self._root = self._new_dir()
        self.log: List[LogEntry] = []
        self.observer = observer

    # -- construction --------------------------------------------------------
    @classmethod
    def from_tree(cls, tree: Tree) -> "RecordingFileSystem":
        """A file system holding exactly ``tree``, every byte and entry durable, with an empty log."""
        fs = cls()
        for path in sorted(tree, key=lambda p: (len(_parts(p)), p)):
            parent, name = fs._parent(path)
            data = tree[path]
            node: _Node = fs._new_dir() if data is None else fs._new_file(data)
            parent.entries[name] = node.ino
            parent.durable[name] = node.ino
        return fs

    def _new_dir(self) -> _Dir:
        node = _Dir(self._next_ino)
        self._nodes[node.ino] = node
        self._next_ino += 1
        return node

    def _new_file(self, durable: bytes = b"") -> _File:
        node = _File(self._next_ino, durable)
        self._nodes[node.ino] = node
        self._next_ino += 1
        return node

    # -- views -----------------------------------------------------------------
    def tree(self) -> Tree:
        """What a process reads now (every write visible, durable or not)."""
        out: Tree = {}
        stack: List[Tuple[str, _Dir]] = [("", self._root)]
        while stack:
            prefix, node = stack.pop()
            for name, ino in node.entries.items():
                child = self._nodes[ino]
                path = prefix + "/" + name
                if isinstance(child, _Dir):
                    out[path] = None
                    stack.append((path, child))
                else:
                    out[path] = bytes(child.data)
        return out

    def crash_space(self, rng: Optional[random.Random] = None) -> CrashSpace:
        """The states a power loss now could leave (see the module's persistence model)."""
        rng = rng or random.Random(0)
        dirs: Dict[int, Tuple[Dict[str, int], List[_Change]]] = {}
        named: Set[int] = set()  # inodes some crash state can reach: named durably or by a pending change
        for ino, node in self._nodes.items():
            if isinstance(node, _Dir):
                dirs[ino] = (dict(node.durable), list(node.changes))
                named.update(node.durable.values())
                named.update(change[-1] for change in node.changes)
        files = {ino: _content_options(node, rng) for ino, node in self._nodes.items()
                 if ino in named and isinstance(node, _File)}
        return CrashSpace(self._root.ino, dirs, files)

    def crash_states(self, rng: Optional[random.Random] = None) -> List[Tree]:
        """Every state :meth:`crash_space` describes, enumerated (for small examples)."""
        return list(self.crash_space(rng).enumerate())

    @property
    def operations(self) -> List[LogEntry]:
        """The durable operations of the log, without markers."""
        return [entry for entry in self.log if entry.kind == "op"]

    # -- annotations and external events ------------------------------------------
    def mark(self, name: str, value: Any = None) -> None:
        """Add a workload marker (``attempt``, ``ack`` ...) to the log; the disk is unchanged."""
        self.log.append(LogEntry("mark", name, "", value))

    def damage(self, path: str, transform: Callable[[bytes], bytes]) -> None:
        """Replace a file's bytes with ``transform(bytes)``, on disk at once, as outside damage would.

        Not an operation of the store: it goes around the persistence model
        (the new bytes are durable, the file's pending history is dropped) and
        appears in the log only as a ``damage`` marker. The observer is told,
        since the disk changed.
        """
        node = self._file(path)
        new = bytes(transform(bytes(node.data)))
        node.data = bytearray(new)
        node.durable = new
        node.history = []
        self.log.append(LogEntry("mark", "damage", path, len(new)))
        if self.observer is not None:
            self.observer(self)

    def _done(self, name: str, path: str, detail: Any = None) -> None:
        self.log.append(LogEntry("op", name, path, detail))
        if self.observer is not None:
            self.observer(self)

    # -- path resolution -----------------------------------------------------------
    def _lookup(self, path: str) -> Optional[_Node]:
        return self._walk(_parts(path), path)

    def _walk(self, parts: Tuple[str, ...], path: str) -> Optional[_Node]:
        node: _Node = self._root
        for part in parts:
            if not isinstance(node, _Dir):
                raise _oserror(NotADirectoryError, errno.ENOTDIR, path)
            ino = node.entries.get(part)
            if ino is None:
                return None
            node = self._nodes[ino]
        return node

    def _parent(self, path: str) -> Tuple[_Dir, str]:
        parts = _parts(path)
        if not parts:
            raise _oserror(IsADirectoryError, errno.EISDIR, path)  # the root has no parent entry
        parent = self._walk(parts[:-1], path)
        if parent is None:
            raise _oserror(FileNotFoundError, errno.ENOENT, path)
        if not isinstance(parent, _Dir):
            raise _oserror(NotADirectoryError, errno.ENOTDIR, path)
        return parent, parts[-1]

    def _file(self, path: str) -> _File:
        node = self._lookup(path)
        if node is None:
            raise _oserror(FileNotFoundError, errno.ENOENT, path)
        if not isinstance(node, _File):
            raise _oserror(IsADirectoryError, errno.EISDIR, path)
        return node

    # -- reads ---------------------------------------------------------------------
    def read(self, path: str) -> bytes:
        return bytes(self._file(path).data)

    def read_from(self, path: str, offset: int) -> bytes:
        return bytes(self._file(path).data[offset:])

    def stat(self, path: str) -> Optional[Tuple[int, int]]:
        node = self._lookup(path)
        if node is None:
            return None
        return (node.ino, len(node.data) if isinstance(node, _File) else 0)

    def exists(self, path: str) -> bool:
        try:
            return self._lookup(path) is not None
        except OSError:
            return False

    def is_symlink(self, path: str) -> bool:
        return False

    def listdir(self, path: str) -> List[str]:
        node = self._lookup(path)
        if node is None:
            raise _oserror(FileNotFoundError, errno.ENOENT, path)
        if not isinstance(node, _Dir):
            raise _oserror(NotADirectoryError, errno.ENOTDIR, path)
        return sorted(node.entries)

    # -- durable operations -----------------------------------------------------------
    def mkdir(self, path: str) -> None:
        if not _parts(path):
            raise _oserror(FileExistsError, errno.EEXIST, path)
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _oserror(FileExistsError, errno.EEXIST, path)
        node = self._new_dir()
        parent.change(("link", name, node.ino))
        self._done("mkdir", path)

    def write_file(self, path: str, data: bytes) -> None:
        parent, name = self._parent(path)
        ino = parent.entries.get(name)
        if ino is None:
            node = self._new_file()
            parent.change(("link", name, node.ino))
        else:
            existing = self._nodes[ino]
            if not isinstance(existing, _File):
                raise _oserror(IsADirectoryError, errno.EISDIR, path)
            node = existing
            node.cut(0)  # O_TRUNC keeps the inode
        node.write(0, bytes(data))
        self._done("write_file", path, len(data))

    def create_exclusive(self, path: str, data: bytes = b"") -> None:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _oserror(FileExistsError, errno.EEXIST, path)
        node = self._new_file()
        parent.change(("link", name, node.ino))
        node.write(0, bytes(data))
        self._done("create_exclusive", path, len(data))

    def append(self, path: str, data: bytes) -> None:
        node = self._file(path)
        node.write(len(node.data), bytes(data))
        self._done("append", path, len(data))

    def overwrite(self, path: str, data: bytes) -> None:
        node = self._file(path)
        node.write(0, bytes(data))
        self._done("overwrite", path, len(data))

    def fsync(self, path: str) -> None:
        node = self._lookup(path)
        if node is None:
            raise _oserror(FileNotFoundError, errno.ENOENT, path)
        node.sync()  # fsync of a directory's descriptor is how its entries are synced
        self._done("fsync", path)

    def replace(self, src: str, dst: str) -> None:
        src_parent, src_name = self._parent(src)
        ino = src_parent.entries.get(src_name)
        if ino is None:
            raise _oserror(FileNotFoundError, errno.ENOENT, src)
        dst_parent, dst_name = self._parent(dst)
        node = self._nodes[ino]
        target_ino = dst_parent.entries.get(dst_name)
        if target_ino == ino:
            self._done("replace", src, dst)  # the same file: rename(2) does nothing
            return
        if target_ino is not None:
            target = self._nodes[target_ino]
            if isinstance(node, _File) and isinstance(target, _Dir):
                raise _oserror(IsADirectoryError, errno.EISDIR, dst)
            if isinstance(node, _Dir) and isinstance(target, _File):
                raise _oserror(NotADirectoryError, errno.ENOTDIR, dst)
            if isinstance(target, _Dir) and target.entries:
                raise _oserror(OSError, errno.ENOTEMPTY, dst)
        if isinstance(node, _Dir) and self._inside(dst_parent, node):
            raise _oserror(OSError, errno.EINVAL, dst)
        if src_parent is dst_parent:
            src_parent.change(("rename", src_name, dst_name, ino))
        else:
            dst_parent.change(("link", dst_name, ino))
            src_parent.change(("unlink", src_name, ino))
        self._done("replace", src, dst)

    def _inside(self, node: _Dir, ancestor: _Dir) -> bool:
        """True when ``node`` is ``ancestor`` or lies below it (a rename there would make a loop)."""
        stack = [ancestor]
        while stack:
            current = stack.pop()
            if current is node:
                return True
            stack.extend(child for child in (self._nodes[i] for i in current.entries.values())
                         if isinstance(child, _Dir))
        return False

    def fsync_dir(self, path: str) -> None:
        node = self._lookup(path)
        if node is None:
            raise _oserror(FileNotFoundError, errno.ENOENT, path)
        if not isinstance(node, _Dir):
            raise _oserror(NotADirectoryError, errno.ENOTDIR, path)
        node.sync()
        self._done("fsync_dir", path)

    def truncate(self, path: str, size: int) -> None:
        if size < 0:
            raise _oserror(OSError, errno.EINVAL, path)
        node = self._file(path)
        node.cut(size)
        self._done("truncate", path, size)

    def unlink(self, path: str) -> None:
        parent, name = self._parent(path)
        ino = parent.entries.get(name)
        if ino is None:
            raise _oserror(FileNotFoundError, errno.ENOENT, path)
        if isinstance(self._nodes[ino], _Dir):
            raise _oserror(IsADirectoryError, errno.EISDIR, path)
        parent.change(("unlink", name, ino))
        self._done("unlink", path)

    def make_private(self, path: str) -> None:
        if not isinstance(self._lookup(path), _Dir):
            raise _oserror(NotADirectoryError, errno.ENOTDIR, path)  # modes are not modelled: only the check

    def lock(self, path: str) -> "contextlib.AbstractContextManager[None]":
        return contextlib.nullcontext()

