"""The persistence model of the power-loss explorer: what a power loss may leave of files and folders.

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
"""

import itertools
import random
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

__all__ = ["DIR_COMBO_LIMIT", "Tree", "CrashSpace"]

#: Directory-choice combinations a crash point may have before its state count
#: becomes an estimate instead of an exact sum.
DIR_COMBO_LIMIT = 1 << 12

#: A crash state: absolute path -> file bytes, or None for a directory. The
#: root directory is implied.
Tree = Dict[str, Optional[bytes]]

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

    def __init__(self, root: int, dirs: Dict[int, Tuple[Dict[str, int], List[_Change]]],
                 files: Dict[int, List[bytes]]) -> None:
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

    def count(self, rng: Optional[random.Random] = None, limit: int = DIR_COMBO_LIMIT,
              samples: int = 64) -> Tuple[int, bool]:
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

