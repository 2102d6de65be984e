"""Power-loss crash-state explorer for the run store.

A workload drives a real :class:`~runner.stores.file.RunStore` over a
:class:`RecordingFileSystem`, an in-memory file system that logs every durable
operation and keeps, beside what a process would read, what the disk is
guaranteed to hold. After every operation the explorer asks which on-disk
states a power loss at that moment could leave, loads each one with the real
loader and checks the store's promise: an acknowledged transition is never
lost, and a load never guesses.

Persistence model
-----------------

The model is deliberately weak: anything it does not promise, the store must
not rely on.

* Files are inodes. An inode holds its *durable* bytes and the history of
  changes (writes, appends, truncations) made since its last ``fsync``. Only an
  ``fsync`` of the file makes its bytes durable.
* A power loss keeps a *prefix* of that history: the durable bytes with the
  first few changes applied, the last of them possibly cut part way. So an
  unsynced append may vanish, survive whole, or survive as any prefix of the
  bytes written. The explorer tries: nothing, everything, every record
  boundary (just after each ``\\n`` written) and one or two cut points inside
  a line drawn from the seeded random generator.
* Directories map names to inodes. A directory holds its *durable* entries and
  the entry changes made since its last ``fsync_dir`` (creations, ``mkdir``,
  renames, unlinks). Each pending change survives a power loss or not,
  independently of the others in the same directory; the survivors apply in
  their original order. A rename within one directory survives or vanishes
  whole and carries the inode it renamed. A rename between directories is an
  unlink in one and a link in the other, each pending in its own directory.
* Different files are not ordered against each other, nor data against
  directory entries: only an ``fsync`` (of the file or the directory)
  separates them.

A crash state is one choice of surviving entry changes per directory and one
content choice per reachable file. ``states_possible`` counts those
combinations (with the prefix lengths listed above, not every byte offset),
exactly while the directory choices number at most :data:`DIR_COMBO_LIMIT`,
otherwise as an estimate from sampled directory choices. When a crash point
has more states than the cap, the explorer samples them with the seeded
generator and reports how many it covered.

Invariant checked at each crash point
-------------------------------------

Let A be the last revision acknowledged before the point (a store call
returned) and T the last revision attempted. Once ``init`` has been
acknowledged, ``RunStore.open`` must succeed with a revision r, A <= r <= T,
whose content is exactly the workload's state at revision r, and
``runner.stores.file.scan`` must agree. Under this model a store that keeps its
write protocol loses at most unacknowledged data, so any
:class:`~runner.errors.StateUnrecoverable` there is a violation. Before
``init`` is acknowledged a load may report "no run" (and a new ``init`` must
then succeed) or give revision 0. For a sample of states the explorer also
commits once more after the load and reloads, because some write paths break
only on the next write.

The head witness
----------------

``head.json`` is modelled like any file: its in-place overwrites are unsynced
writes that a power loss may keep, lose or cut, so crash states hold older
heads and torn ones. The invariant above is what makes them safe: any
``StateUnrecoverable`` after ``init`` was acknowledged is a violation, so a
head that raised an alarm over an honest power loss would be counted
(``false_alarms``). The report also counts how the head stood in the states
that loaded (``head_states``: ``current``, ``behind``, ``invalid``,
``missing``; ``ahead`` would be a bug), and after each acknowledgement that
leaves records in the journal it loads one more state outside the power-loss
model: the folder as a process sees it with the journal cut at a random byte,
which loses acknowledged records and must stop the run (``losses_probed``,
``losses_caught``; a miss is a ``loss-unnoticed`` violation).
"""

import bisect
import contextlib
import errno
import hashlib
import itertools
import os
import posixpath
import random
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, Type, Union

from ..envelope import canonical_json
from ..errors import InvalidInput, RunnerError, StateUnrecoverable
from ..fs import FileSystem
from ..stores.codec import decode_identity, decode_record
from ..stores.file import HEAD, RunStore, decode_head, encode_head, scan
from ..windows import NO_HOOKS, Hooks
from .faults import Chain

__all__ = [
    "DIR_COMBO_LIMIT",
    "VARIANTS",
    "LogEntry",
    "CrashSpace",
    "RecordingFileSystem",
    "explore",
]

#: Directory-choice combinations a crash point may have before its state count
#: becomes an estimate instead of an exact sum.
DIR_COMBO_LIMIT = 1 << 12

#: The deliberately broken write paths :func:`explore` can check, by name.
VARIANTS = ("no-file-fsync", "no-dir-fsync", "snapshot-before-journal", "no-journal-fsync", "head-before-append")

#: A crash state: absolute path -> file bytes, or None for a directory. The
#: root directory is implied.
Tree = Dict[str, Optional[bytes]]

_RUN = "/run"
_CLOCK_START = 1_767_225_600.0  # a fixed instant, so every run of a seed is identical
_LOAD_CLOCK = 1_767_312_000.0
_COMPACT_MIN_BYTES = 512
_TORN_TAIL = b'{"h":"' + b"5" * 40  # an append cut short before its newline


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


# -- the model ------------------------------------------------------------------

_Change = Tuple[Any, ...]  # file: ("write", offset, bytes) | ("trunc", size); dir: see _Dir


class _File:
    """An inode's bytes as a process reads them, its durable bytes, and the changes between."""

    __slots__ = ("ino", "data", "durable", "history")

    def __init__(self, ino: int, durable: bytes = b"") -> None:
        self.ino = ino
        self.data = bytearray(durable)
        self.durable = durable
        self.history: List[_Change] = []

    def write(self, offset: int, chunk: bytes) -> None:
        _apply_file_change(self.data, ("write", offset, chunk))
        if chunk:
            self.history.append(("write", offset, bytes(chunk)))

    def cut(self, size: int) -> None:
        _apply_file_change(self.data, ("trunc", size))
        self.history.append(("trunc", size))

    def sync(self) -> None:
        self.durable = bytes(self.data)
        self.history = []


class _Dir:
    """A directory's entries as a process sees them, its durable entries, and the changes between.

    Entry changes: ``("link", name, ino)``, ``("unlink", name, ino)`` and
    ``("rename", src, dst, ino)`` for a rename inside this directory.
    """

    __slots__ = ("ino", "entries", "durable", "changes")

    def __init__(self, ino: int) -> None:
        self.ino = ino
        self.entries: Dict[str, int] = {}
        self.durable: Dict[str, int] = {}
        self.changes: List[_Change] = []

    def change(self, change: _Change) -> None:
        _apply_dir_change(self.entries, change)
        self.changes.append(change)

    def sync(self) -> None:
        self.durable = dict(self.entries)
        self.changes = []


_Node = Union[_File, _Dir]


def _apply_file_change(buf: bytearray, change: _Change) -> None:
    if change[0] == "trunc":
        size = change[1]
        if size < len(buf):
            del buf[size:]
        else:
            buf.extend(bytes(size - len(buf)))
    else:
        offset, chunk = change[1], change[2]
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset : offset + len(chunk)] = chunk


def _apply_dir_change(entries: Dict[str, int], change: _Change) -> None:
    kind = change[0]
    if kind == "link":
        entries[change[1]] = change[2]
    elif kind == "unlink":
        if entries.get(change[1]) == change[2]:
            del entries[change[1]]
    else:  # rename: the surviving rename carries its inode even if its source never became durable
        src, dst, ino = change[1], change[2], change[3]
        if entries.get(src) == ino:
            del entries[src]
        entries[dst] = ino


def _content_options(node: _File, rng: random.Random, cuts: int = 2) -> List[bytes]:
    """The contents a power loss may leave in ``node``: prefixes of its unsynced history.

    Always includes the durable bytes and the full current bytes; also every
    record boundary inside a pending write and up to ``cuts`` random points
    strictly inside a line. Distinct values only, in history order.
    """
    if not node.history:
        return [node.durable]
    points: List[Tuple[int, int]] = [(0, 0)]  # (changes applied whole, bytes of the next write)
    interior: List[Tuple[int, int]] = []  # (change index, its length) of writes that can be cut
    for index, change in enumerate(node.history):
        if change[0] == "write":
            chunk = change[2]
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    break
                points.append((index, nl + 1))
                start = nl + 1
            if len(chunk) > 1:
                interior.append((index, len(chunk)))
        points.append((index + 1, 0))
    total = sum(length - 1 for _, length in interior)
    for _ in range(cuts if total else 0):
        # Draw one offset uniformly over every interior position of every pending write.
        pick = rng.randrange(total)
        for index, length in interior:
            if pick < length - 1:
                chunk = node.history[index][2]
                at = pick + 1
                if chunk[at - 1 : at] != b"\n":  # a boundary is already a point
                    points.append((index, at))
                break
            pick -= length - 1
    seen: Dict[bytes, None] = {}
    for whole, part in sorted(set(points)):
        buf = bytearray(node.durable)
        for change in node.history[:whole]:
            _apply_file_change(buf, change)
        if part:
            change = node.history[whole]
            _apply_file_change(buf, ("write", change[1], change[2][:part]))
        seen.setdefault(bytes(buf), None)
    return list(seen)


class CrashSpace:
    """Every on-disk state a power loss at one moment could leave, under the model.

    A frozen copy: later operations on the file system do not change it. A
    state is one entry-change subset (a bit mask) per directory with pending
    changes, and one content choice per reachable file with pending bytes.
    """

    def __init__(self, root: int, dirs: Dict[int, Tuple[Dict[str, int], List[_Change]]], files: Dict[int, List[bytes]]) -> None:
        self.root = root
        self._dirs = dirs
        self._files = files
        self._pending_dirs = sorted(ino for ino, (_, changes) in dirs.items() if changes)

    @property
    def dir_combinations(self) -> int:
        """How many ways the pending directory changes can survive."""
        return 1 << sum(len(self._dirs[ino][1]) for ino in self._pending_dirs)

    def _walk(self, masks: Dict[int, int]) -> List[Tuple[str, int]]:
        """``(path, inode)`` of every node reachable from the root given the directory choices."""
        out: List[Tuple[str, int]] = []
        stack: List[Tuple[str, int]] = [("", self.root)]
        seen = {self.root}
        while stack:
            prefix, ino = stack.pop()
            durable, changes = self._dirs[ino]
            entries = dict(durable)
            mask = masks.get(ino, 0)
            for bit, change in enumerate(changes):
                if mask >> bit & 1:
                    _apply_dir_change(entries, change)
            for name in sorted(entries):
                child = entries[name]
                if child in seen:  # a second name for a directory already walked
                    continue
                path = prefix + "/" + name
                out.append((path, child))
                if child in self._dirs:
                    seen.add(child)
                    stack.append((path, child))
        return out

    def _variable_files(self, nodes: List[Tuple[str, int]]) -> List[int]:
        found = dict.fromkeys(ino for _, ino in nodes if ino in self._files and len(self._files[ino]) > 1)
        return sorted(found)

    def _tree(self, nodes: List[Tuple[str, int]], picks: Dict[int, int]) -> Tree:
        tree: Tree = {}
        for path, ino in nodes:
            if ino in self._dirs:
                tree[path] = None
            else:
                options = self._files[ino]
                tree[path] = options[picks.get(ino, 0)]
        return tree

    def _all_masks(self) -> Iterator[Dict[int, int]]:
        sizes = [1 << len(self._dirs[ino][1]) for ino in self._pending_dirs]
        for combo in itertools.product(*map(range, sizes)):
            yield dict(zip(self._pending_dirs, combo))

    def _random_masks(self, rng: random.Random) -> Dict[int, int]:
        return {ino: rng.getrandbits(len(self._dirs[ino][1])) for ino in self._pending_dirs}

    def _states_under(self, masks: Dict[int, int]) -> int:
        nodes = self._walk(masks)
        count = 1
        for ino in self._variable_files(nodes):
            count *= len(self._files[ino])
        return count

    def count(self, rng: Optional[random.Random] = None, limit: int = DIR_COMBO_LIMIT, samples: int = 64) -> Tuple[int, bool]:
        """``(states, exact)``: the exact number of states, or an estimate when directory choices exceed ``limit``.

        The estimate is the number of directory choices times the mean
        number of content choices over ``samples`` random directory choices.
        """
        combos = self.dir_combinations
        if combos <= limit:
            return sum(self._states_under(m) for m in self._all_masks()), True
        rng = rng or random.Random(0)
        drawn = sum(self._states_under(self._random_masks(rng)) for _ in range(samples))
        return max(1, combos * drawn // samples), False  # integers: combos can exceed any float

    def enumerate(self) -> Iterator[Tree]:
        """Every state, directory choices outermost. Only sensible when :meth:`count` is small."""
        for masks in self._all_masks():
            nodes = self._walk(masks)
            variable = self._variable_files(nodes)
            for combo in itertools.product(*(range(len(self._files[ino])) for ino in variable)):
                yield self._tree(nodes, dict(zip(variable, combo)))

    def sample(self, n: int, rng: random.Random) -> List[Tree]:
        """Up to ``n`` distinct states drawn at random (each choice uniform and independent)."""
        out: List[Tree] = []
        seen = set()
        for _ in range(4 * n):
            if len(out) >= n:
                break
            masks = self._random_masks(rng)
            nodes = self._walk(masks)
            picks = {ino: rng.randrange(len(self._files[ino])) for ino in self._variable_files(nodes)}
            key = (tuple(sorted(masks.items())), tuple(sorted(picks.items())))
            if key in seen:
                continue
            seen.add(key)
            out.append(self._tree(nodes, picks))
        return out


# -- the recording file system -----------------------------------------------------


def _oserror(cls: Type[OSError], code: int, path: str) -> OSError:
    return cls(code, os.strerror(code), path)


def _parts(path: str) -> List[str]:
    # Relative paths resolve against the root, the model's only working directory.
    norm = posixpath.normpath(posixpath.join("/", path))
    return [part for part in norm.split("/") if part]


class RecordingFileSystem(FileSystem):
    """An in-memory :class:`~runner.fs.FileSystem` that records durable operations.

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
        named = set()  # inodes some crash state can reach: named durably or by a pending change
        for ino, node in self._nodes.items():
            if isinstance(node, _Dir):
                dirs[ino] = (dict(node.durable), list(node.changes))
                named.update(node.durable.values())
                named.update(change[-1] for change in node.changes)
        files = {ino: _content_options(node, rng) for ino, node in self._nodes.items() if ino in named and isinstance(node, _File)}
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
        node: _Node = self._root
        for part in _parts(path):
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
        parent = self._lookup("/" + "/".join(parts[:-1]))
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
            stack.extend(child for child in (self._nodes[i] for i in current.entries.values()) if isinstance(child, _Dir))
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


# -- deliberately broken write paths ----------------------------------------------------


class _LyingDisk(RecordingFileSystem):
    """The recording disk acknowledging some syncs without doing them: the model of a write path that leaves them out.

    Every folder sync is dropped when ``drops_dir_fsyncs``; the next file sync
    after :meth:`drop_next_fsync` (called by hooks at a window) is dropped too.
    A dropped sync is not an operation: nothing is logged, the disk is unchanged.
    """

    drops_dir_fsyncs = False

    def __init__(self, observer: Optional[Callable[["RecordingFileSystem"], None]] = None) -> None:
        super().__init__(observer)
        self._drop_next = False

    def drop_next_fsync(self) -> None:
        self._drop_next = True

    def fsync(self, path: str) -> None:
        if self._drop_next:
            self._drop_next = False
            return
        super().fsync(path)

    def fsync_dir(self, path: str) -> None:
        if not self.drops_dir_fsyncs:
            super().fsync_dir(path)


class _DirSyncDroppingDisk(_LyingDisk):
    drops_dir_fsyncs = True


class _DropTempFsyncs(Hooks):
    """Hooks that make the disk skip the sync of every new file written beside its target (the window just before it)."""

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk

    def reached(self, window: str, **facts: Any) -> None:
        if window == "store:after-temp-write" and isinstance(self.disk, _LyingDisk):
            self.disk.drop_next_fsync()


class _MarkWindows(Hooks):
    """Writes each window the store passes into the disk's log, so a crash point can be named by its window."""

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk

    def reached(self, window: str, **facts: Any) -> None:
        self.disk.mark("window", window)


class _SnapshotBeforeRecord(Hooks):
    """A deliberately wrong write order: a compaction's snapshot is made durable before the record that triggered it.

    That breaks "the journal files always hold the record at the snapshot's
    revision". Hooks cannot reorder the store's calls, so when a compaction
    starts right after a record was appended, these take the record back
    off the journal (a ``damage`` of the model, behind the store's back) and
    append and sync it again once the new snapshot's rename is durable. Only
    used to show that the explorer catches such an order.
    """

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk
        self.previous = ""
        self.appended: Optional[Tuple[str, bytes]] = None
        self.held: Optional[Tuple[str, bytes]] = None

    def reached(self, window: str, **facts: Any) -> None:
        if window == "store:before-append":
            self.appended = (facts["path"], facts["data"])
        elif window == "store:before-compaction" and self.previous == "store:after-append-fsync" and self.appended is not None:
            path, data = self.held = self.appended
            self.disk.damage(path, lambda journal: journal[: len(journal) - len(data)])
        elif window == "store:after-rename-fsync" and self.held is not None:
            path, data = self.held
            self.held = None
            self.disk.append(path, data)
            self.disk.fsync(path)
        self.previous = window


class _HeadBeforeAppend(Hooks):
    """A deliberately wrong witness: ``head.json`` names the new revision before its record is appended.

    A power loss can then keep the head and lose the record, and the loader,
    which trusts a valid head as a lower bound, raises a false alarm over a
    run that lost only an unacknowledged transition. Only used to show that
    the explorer catches a witness that may lead the journal.
    """

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk

    def reached(self, window: str, **facts: Any) -> None:
        if window != "store:before-append":
            return
        folder = posixpath.dirname(facts["path"])
        identity = decode_identity(self.disk.read(posixpath.join(folder, "run.json")))
        digest, body = decode_record(facts["data"].rstrip(b"\n"))
        ahead = {"task_id": identity["task_id"], "created_at": identity["created_at"], "revision": body["rev"], "head": digest}
        self.disk.overwrite(posixpath.join(folder, HEAD), encode_head(ahead))


class _Variant(NamedTuple):
    disk: Type[RecordingFileSystem]
    hooks: Callable[[RecordingFileSystem], Hooks]
    durability: str

    def options(self, disk: RecordingFileSystem, clock: Callable[[], float]) -> Dict[str, Any]:
        """The store options of this write path over ``disk``."""
        return dict(fs=disk, hooks=self.hooks(disk), clock=clock, durability=self.durability, compact_min_bytes=_COMPACT_MIN_BYTES)


def _no_hooks(disk: RecordingFileSystem) -> Hooks:
    return NO_HOOKS


def _variant(name: Optional[str]) -> _Variant:
    """The store class, disk model, hooks and durability of a write path, by variant name."""
    if name is None:
        return _Variant(RecordingFileSystem, _no_hooks, "sync")
    if name == "no-file-fsync":
        return _Variant(_LyingDisk, _DropTempFsyncs, "sync")
    if name == "no-dir-fsync":
        return _Variant(_DirSyncDroppingDisk, _no_hooks, "sync")
    if name == "snapshot-before-journal":
        return _Variant(RecordingFileSystem, _SnapshotBeforeRecord, "sync")
    if name == "no-journal-fsync":
        return _Variant(RecordingFileSystem, _no_hooks, "process")
    if name == "head-before-append":
        return _Variant(RecordingFileSystem, _HeadBeforeAppend, "sync")
    raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")


# -- loading one crash state ----------------------------------------------------------------


class _Outcome(NamedTuple):
    """What loading one crash state gave; shared by every crash point that can leave that state."""

    error: Optional[str]  # class name of the exception open() raised, if any
    message: str
    revision: Optional[int]
    digest: Optional[str]  # SHA-256 of the loaded state's canonical JSON
    scan_problem: Optional[str]
    followup: Optional[str]  # None: not tried; "" passed; else what went wrong
    summary: str
    head: str = ""  # after a load: the witness was "current", "behind", "invalid" or "missing"


def _tick_clock(start: float) -> Callable[[], float]:
    """A deterministic clock that advances one millisecond per reading."""
    now = [start]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    return clock


def _digest(state: Dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(state)).hexdigest()


def _tree_key(tree: Tree) -> str:
    h = hashlib.sha256()
    for path in sorted(tree):
        data = tree[path]
        h.update(path.encode() + b"\0" + (b"D" if data is None else b"F%d:" % len(data) + data) + b"\0")
    return h.hexdigest()


def _summary(tree: Tree) -> str:
    """A one-line listing of a crash state: each file under the run folder and its size."""
    parts = []
    prefix = _RUN + "/"
    for path in sorted(tree):
        if not path.startswith(prefix):
            continue
        data = tree[path]
        name = path[len(prefix) :]
        if data is None:
            continue
        parts.append(f"{name}={len(data)}B" + ("" if not data or data.endswith(b"\n") else "(no final newline)"))
    if _RUN not in tree:
        return "no run folder"
    return " ".join(parts) or "empty run folder"


def _load(tree: Tree, variant: _Variant, plan: Dict[str, Any], task_id: str, followup: bool) -> _Outcome:
    """Load ``tree`` with the real loader, compare with ``scan``, and optionally write once more.

    Never raises: anything unexpected is reported in the outcome.
    """
    fs = variant.disk.from_tree(tree)

    def clock() -> float:
        return _LOAD_CLOCK  # loads and their follow-ups all happen at one fixed instant

    options = variant.options(fs, clock)
    summary = _summary(tree)
    scan_problem: Optional[str] = None
    try:
        found = scan(_RUN, fs)
    except Exception as exc:  # the loader must not fail this way; report it
        found = None
        scan_problem = f"scan raised {type(exc).__name__}: {exc}"
    try:
        store = RunStore.open(_RUN, **options)
    except RunnerError as exc:
        if found is not None and found.state is not None:
            scan_problem = f"scan loaded revision {found.state['revision']} but open raised {type(exc).__name__}"
        outcome = _Outcome(type(exc).__name__, exc.message, None, None, scan_problem, None, summary)
        if followup and isinstance(exc, InvalidInput):
            outcome = outcome._replace(followup=_reinit(fs, variant, plan, task_id, clock))
        return outcome
    except Exception as exc:
        return _Outcome(type(exc).__name__, f"unexpected {type(exc).__name__}: {exc}", None, None, scan_problem, None, summary)
    revision = int(store.state["revision"])
    digest = _digest(store.state)
    if found is not None and (found.state is None or _digest(found.state) != digest):
        scan_problem = "scan and open disagree about the state"
    outcome = _Outcome(None, "", revision, digest, scan_problem, None, summary, _head_status(tree, revision))
    if followup:
        outcome = outcome._replace(followup=_write_again(store, fs, variant, clock))
    return outcome


def _head_status(tree: Tree, revision: int) -> str:
    """How the witness in ``tree`` stands to the revision that loaded from it."""
    data = tree.get(_RUN + "/" + HEAD)
    if data is None:
        return "missing"
    try:
        head_rev, _ = decode_head(data, decode_identity(tree[_RUN + "/run.json"] or b""))
    except (KeyError, ValueError, InvalidInput):
        return "invalid"
    return "current" if head_rev == revision else "behind" if head_rev < revision else "ahead"


def _write_again(store: RunStore, fs: RecordingFileSystem, variant: _Variant, clock: Callable[[], float]) -> str:
    """Commit once more after a load and reload: "" when revision r+1 reloads identically."""
    before = store.revision
    try:
        store.commit([["set", ["effects", "probe"], {"status": "after-crash"}]])
        after = store.revision
        expected = _digest(store.state)
        again = RunStore.open(_RUN, **variant.options(fs, clock))
    except Exception as exc:
        return f"the next commit after loading revision {before} failed: {type(exc).__name__}: {exc}"
    if after != before + 1:
        return f"the next commit after loading revision {before} gave revision {after}"
    if again.revision != after or _digest(again.state) != expected:
        return f"after committing revision {after}, a reload gave revision {again.revision} with other content"
    return ""


def _reinit(fs: RecordingFileSystem, variant: _Variant, plan: Dict[str, Any], task_id: str, clock: Callable[[], float]) -> str:
    """After "no run", a new init must succeed and reload at revision 0: "" when it does."""
    try:
        store = RunStore.create(_RUN, task_id, plan, **variant.options(fs, clock))
        again = RunStore.open(_RUN, fs=fs, clock=clock)
    except Exception as exc:
        return f"a new init after 'no run' failed: {type(exc).__name__}: {exc}"
    if again.revision != 0 or _digest(again.state) != _digest(store.state):
        return f"a new init after 'no run' reloaded at revision {again.revision} with other content"
    return ""


# -- the explorer ----------------------------------------------------------------------------------


class _Point(NamedTuple):
    log_len: int  # entries in the log when the point was taken
    op: str
    possible: int
    exact: bool
    explored: int
    sampled: bool
    outcomes: Dict[str, int]  # tree key -> how many explored states gave that tree


class _Explorer:
    """Collects, after every operation, the crash states of that moment and their load outcomes."""

    def __init__(self, variant: _Variant, seed: int, cap: int, followup_rate: float, plan: Dict[str, Any], task_id: str) -> None:
        self.variant = variant
        # Separate streams, so the states counted do not depend on the cap or
        # on which states were sampled.
        self.cuts = random.Random(f"cuts/{seed}")
        self.estimates = random.Random(f"estimates/{seed}")
        self.sampling = random.Random(f"sampling/{seed}")
        self.followup_draws = random.Random(f"followups/{seed}")
        self.cap = cap
        self.followup_rate = followup_rate
        self.plan = plan
        self.task_id = task_id
        self.points: List[_Point] = []
        self.outcomes: Dict[str, _Outcome] = {}
        self.followups = 0

    def observe(self, fs: RecordingFileSystem) -> None:
        space = fs.crash_space(self.cuts)
        possible, exact = space.count(self.estimates)
        sampled = possible > self.cap
        trees = space.sample(self.cap, self.sampling) if sampled else list(space.enumerate())
        counts: Dict[str, int] = {}
        for tree in trees:
            key = _tree_key(tree)
            if key not in self.outcomes:
                followup = self.followup_draws.random() < self.followup_rate
                self.followups += followup
                self.outcomes[key] = _load(tree, self.variant, self.plan, self.task_id, followup)
            counts[key] = counts.get(key, 0) + 1
        last = fs.log[-1].describe() if fs.log else "(before the first operation)"
        self.points.append(_Point(len(fs.log), last, possible, exact, len(trees), sampled, counts))


def _judge(outcome: _Outcome, acked: Optional[int], attempted: Optional[int], refs: Dict[int, str]) -> List[Tuple[str, str]]:
    """The invariants ``outcome`` breaks at a crash point with acknowledged ``acked`` and attempted ``attempted``."""
    problems: List[Tuple[str, str]] = []
    if outcome.scan_problem:
        problems.append(("scan-disagrees", outcome.scan_problem))
    if outcome.error is not None and outcome.error not in (InvalidInput.__name__, StateUnrecoverable.__name__):
        problems.append(("unexpected-error", outcome.message))
        return problems
    if acked is None:
        if outcome.error == StateUnrecoverable.__name__:
            problems.append(("bad-init-state", f"StateUnrecoverable before init was acknowledged: {outcome.message}"))
        elif outcome.error is None and outcome.revision != 0:
            problems.append(("bad-init-state", f"loaded revision {outcome.revision} before init was acknowledged"))
        elif outcome.error is None and outcome.digest != refs.get(0):
            problems.append(("content", "revision 0 differs from the state init created"))
    elif outcome.error == StateUnrecoverable.__name__:
        problems.append(("unrecoverable", f"StateUnrecoverable although revision {acked} was acknowledged: {outcome.message}"))
    elif outcome.error == InvalidInput.__name__:
        problems.append(("no-run", f"'no run' although init was acknowledged: {outcome.message}"))
    else:
        r = outcome.revision
        assert r is not None and attempted is not None
        if r < acked:
            problems.append(("lost-ack", f"loaded revision {r}, but revision {acked} was acknowledged"))
        elif r > attempted:
            problems.append(("phantom", f"loaded revision {r}, but only {attempted} was ever attempted"))
        elif outcome.digest != refs.get(r):
            problems.append(("content", f"revision {r} differs from the workload's state at revision {r}"))
    if outcome.followup and not problems:
        problems.append(("reinit-refused" if outcome.error == InvalidInput.__name__ else "next-write", outcome.followup))
    return problems


def _workload(
    rec: RecordingFileSystem,
    variant: _Variant,
    transitions: int,
    rng: random.Random,
    plan: Dict[str, Any],
    task_id: str,
    probes: Optional[List[Tree]] = None,
    probe_rng: Optional[random.Random] = None,
) -> Dict[int, str]:
    """Drive the store through init, ``transitions`` commits, compactions and two repairs.

    Returns the digest of the reference state at every revision. A third of
    the way in, the snapshot is damaged behind the store's back and a fresh
    store opened (its next commit quarantines and rewrites it); two thirds of
    the way, a torn record is left at the journal's end (the next commit
    truncates it). Each window the store passes is marked in the log.
    After each acknowledgement that leaves records in the journal,
    ``probes`` gets a copy of the folder as a process sees it with the
    journal cut at a random byte (from ``probe_rng``): outside damage that
    loses acknowledged records, which the head witness must expose.
    """
    clock = _tick_clock(_CLOCK_START)
    options = variant.options(rec, clock)
    options["hooks"] = Chain(_MarkWindows(rec), options["hooks"])
    refs: Dict[int, str] = {}
    rec.mark("attempt", 0)
    store = RunStore.create(_RUN, task_id, plan, **options)
    refs[0] = _digest(store.state)
    rec.mark("ack", 0)
    damage = {max(1, transitions // 3): "snapshot", max(2, (2 * transitions) // 3): "torn"}
    # Large records: in pairs, and right after the snapshot repair (whose
    # compaction leaves an empty journal), so that a compaction falls due
    # with nothing appended since the last one.
    large = {i for i in range(1, transitions + 1) if i % 10 in (4, 5)} | {min(damage) + 1}
    live: List[str] = []
    for i in range(1, transitions + 1):
        event = damage.get(i)
        if event == "snapshot":
            def flip(data: bytes) -> bytes:
                mid = len(data) // 2
                return data[:mid] + bytes([data[mid] ^ 0x01]) + data[mid + 1 :]
            rec.damage(_RUN + "/snapshot.json", flip)
            store = RunStore.open(_RUN, **options)
        elif event == "torn":
            rec.damage(_RUN + "/journal.jsonl", lambda data: data + _TORN_TAIL)
            store = RunStore.open(_RUN, **options)
        if i in large:
            ops = [["set", ["effects", "blob"], {"data": "%x" % rng.getrandbits(4800), "n": i}]]
        elif i % 10 == 7 and "blob" in store.state["effects"]:
            ops = [["del", ["effects", "blob"]]]
        else:
            roll = rng.random()
            if live and roll < 0.2:
                ops = [["del", ["effects", live.pop(rng.randrange(len(live)))]]]
            elif live and roll < 0.55:
                key = rng.choice(live)
                ops = [["set", ["effects", key], {"status": "done", "n": i, "note": "%x" % rng.getrandbits(64)}]]
            else:
                key = f"e{i}"
                live.append(key)
                ops = [["set", ["effects", key], {"status": "pending", "n": i, "note": "x" * rng.randrange(8, 60)}]]
        revision = store.revision + 1
        rec.mark("attempt", revision)
        store.commit(ops)
        if store.revision != revision:
            raise AssertionError(f"the workload expected revision {revision}, the store reports {store.revision}")
        refs[revision] = _digest(store.state)
        rec.mark("ack", revision)
        if probes is not None and probe_rng is not None:
            tree = rec.tree()
            journal = tree.get(_RUN + "/journal.jsonl")
            if journal:
                tree[_RUN + "/journal.jsonl"] = journal[: probe_rng.randrange(len(journal))]
                probes.append(tree)
    return refs


def explore(
    transitions: int = 40,
    seed: int = 1,
    max_states_per_point: int = 64,
    variant: Optional[str] = None,
    followup_rate: float = 0.5,
) -> Dict[str, Any]:
    """Run the workload over a recording file system and check every crash state it could leave.

    ``variant`` selects a deliberately broken write path (one of
    :data:`VARIANTS`) to show the check bites. Everything is deterministic
    from ``seed``. The report's counts: ``crash_points`` (one after every
    operation or damage event, plus the empty start), ``states_possible``
    (exact only when ``possible_exact``), ``states_explored`` (equal to it
    unless ``sampled``), ``violations`` (explored states that broke the
    invariant; ``violation_kinds`` counts them by invariant), the witness's
    figures (``false_alarms``, ``head_states``, ``losses_probed``,
    ``losses_caught``; see the module docs) and ``examples``, each naming the
    operation and the store window (:mod:`runner.windows`) its crash point follows.
    """
    if transitions < 3:
        raise ValueError("the workload needs at least 3 transitions")
    if max_states_per_point < 1 or not 0.0 <= followup_rate <= 1.0:
        raise ValueError("max_states_per_point must be at least 1 and followup_rate within [0, 1]")
    started = time.perf_counter()
    config = _variant(variant)
    plan = {"goal": "power-loss exploration", "steps": [{"id": "work"}]}
    task_id = f"powerloss-{seed}"
    explorer = _Explorer(config, seed, max_states_per_point, followup_rate, plan, task_id)
    rec = config.disk()
    explorer.observe(rec)  # the empty disk before anything happened
    rec.observer = explorer.observe
    probes: List[Tree] = []
    workload_rng, probe_rng = random.Random(f"workload/{seed}"), random.Random(f"probes/{seed}")
    refs = _workload(rec, config, transitions, workload_rng, plan, task_id, probes, probe_rng)
    rec.observer = None

    # A point sees the markers written before the next change of the disk:
    # a crash right after an fsync, once the call has returned, must keep it.
    log = rec.log
    acked: List[Optional[int]] = []
    attempted: List[Optional[int]] = []
    a: Optional[int] = None
    t: Optional[int] = None
    for entry in log:
        acked.append(a)
        attempted.append(t)
        if entry.kind == "mark" and entry.name == "ack":
            a = entry.detail
        elif entry.kind == "mark" and entry.name == "attempt":
            t = entry.detail
    acked.append(a)
    attempted.append(t)
    changes = [i for i, entry in enumerate(log) if entry.kind == "op" or entry.name == "damage"]
    # The window a point lies in: the first window marked after its operation, before the next change.
    window_at: List[Optional[str]] = [None] * (len(log) + 1)
    for i in range(len(log) - 1, -1, -1):
        entry = log[i]
        if entry.kind == "mark" and entry.name == "window":
            window_at[i] = entry.detail
        elif entry.kind == "mark" and entry.name != "damage":
            window_at[i] = window_at[i + 1]

    violations = 0
    kinds: Dict[str, int] = {}
    examples: List[Dict[str, Any]] = []
    seen_kinds = set()
    for index, point in enumerate(explorer.points):
        at = bisect.bisect_left(changes, point.log_len)
        upto = changes[at] if at < len(changes) else len(log)
        point_acked, point_attempted = acked[upto], attempted[upto]
        for key, count in point.outcomes.items():
            outcome = explorer.outcomes[key]
            problems = _judge(outcome, point_acked, point_attempted, refs)
            if not problems:
                continue
            violations += count
            for kind, _ in problems:
                kinds[kind] = kinds.get(kind, 0) + count
            fresh = [kind for kind, _ in problems if kind not in seen_kinds]
            if fresh or len(examples) < 3:
                if len(examples) < 8:
                    examples.append(
                        {
                            "crash_point": index,
                            "after": point.op,
                            "window": window_at[point.log_len],
                            "acknowledged": point_acked,
                            "attempted": point_attempted,
                            "state": outcome.summary,
                            "loaded": outcome.revision if outcome.error is None else outcome.error,
                            "invariant": problems[0][0],
                            "problem": "; ".join(message for _, message in problems),
                        }
                    )
                seen_kinds.update(kind for kind, _ in problems)

    heads: Dict[str, int] = {}
    for point in explorer.points:
        for key, count in point.outcomes.items():
            status = explorer.outcomes[key].head
            if status:
                heads[status] = heads.get(status, 0) + count
    caught = 0
    for probe in probes:
        outcome = _load(probe, config, plan, task_id, followup=False)
        if outcome.error == StateUnrecoverable.__name__:
            caught += 1
            continue
        violations += 1
        kinds["loss-unnoticed"] = kinds.get("loss-unnoticed", 0) + 1
        if len(examples) < 8:
            loaded = outcome.revision if outcome.error is None else outcome.error
            examples.append({"crash_point": None, "after": "outside damage: the journal cut at a random byte", "acknowledged": max(refs),
                             "attempted": max(refs), "state": outcome.summary, "loaded": loaded, "invariant": "loss-unnoticed",
                             "problem": f"acknowledged records were cut off and the load gave {loaded!r}"})

    ops = rec.operations
    return {
        "variant": variant or "none",
        "seed": seed,
        "transitions": transitions,
        "crash_points": len(explorer.points),
        "states_possible": sum(p.possible for p in explorer.points),
        "possible_exact": all(p.exact for p in explorer.points),
        "states_explored": sum(p.explored for p in explorer.points),
        "sampled": any(p.sampled for p in explorer.points),
        "points_sampled": sum(1 for p in explorer.points if p.sampled),
        "distinct_states": len(explorer.outcomes),
        "followups": explorer.followups,
        "violations": violations,
        "violation_kinds": dict(sorted(kinds.items())),
        "false_alarms": kinds.get("unrecoverable", 0),
        "head_states": dict(sorted(heads.items())),
        "losses_probed": len(probes),
        "losses_caught": caught,
        "examples": examples,
        "workload": {
            "operations": len(ops),
            "revisions": max(refs),
            "compactions": sum(1 for e in ops if e.name == "replace" and e.path.endswith("/journal.jsonl")),
            "quarantines": sum(1 for e in ops if e.name == "mkdir" and "/quarantine/" in e.path),
            "torn_repairs": sum(1 for e in ops if e.name == "truncate"),
        },
        "seconds": round(time.perf_counter() - started, 3),
    }
