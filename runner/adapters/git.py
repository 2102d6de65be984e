"""A git repository as a target (``effects.git``): a release commit made once, its tag, both pushed at once.

The contract names, for each batch item, the repository's folder, the files
written (or a command that edits), the commit's message, the tag, the remote
and the branch; :func:`~runner.contract.git.git_problems` checks the section
and :class:`GitAdapter` is the :class:`runner.calls.target.Adapter` that
carries it out::

    "git": {"files": {"VERSION": "{payload.version}\\n"}, "message": "Release {payload.version}",
            "tag": "v{payload.version}", "remote": "origin", "branch": "main"}

Every git command runs without a shell, in the item's repository, through
:func:`runner.calls.commands.run_command`: each is registered as the call in
flight (:mod:`runner.calls.inflight`), so a drive killed mid-push leaves a
call that whoever takes over waits for (and kills at its deadline), and each
gets what is left of the call's time. Git runs with ``GIT_TERMINAL_PROMPT=0``
(a credential prompt fails at once instead of waiting), ``LC_ALL=C`` (its
words are read in English), and none of the variables that would send it to
another repository (``GIT_DIR``...); it never looks for a repository above
the item's folder.

* invoke: on the branch the contract names, the **release commit** is the
  commit the tag already names when it carries the key's trailer
  (``Runner-Key: KEY``), else the newest of HEAD's last commits that carries
  it, else a new one: the files written, the edit command run, everything
  they changed committed, with the message and the trailer. A tag that names
  another commit is refused, never moved. Then the tag is made (if missing)
  and ``git push --atomic REMOTE COMMIT:refs/heads/BRANCH
  refs/tags/TAG:refs/tags/TAG``: both refs or neither. Its answer: done, the
  receipt; refused by a hook whose words the contract's ``not_now`` names
  (default "try again later", "temporarily"), "not now" (after the ``retry
  after N`` seconds it may name); refused otherwise (non-fast-forward, the tag
  exists at the remote, a hook's other words), refused for good with git's
  words; no connection made (an unknown host, a refused connection), nothing
  sent; anything else (a connection lost mid-push, a timeout), unknown.
  The repository refusing a local step (HEAD on another branch, the tag at
  another commit, a commit or a tag git refuses) is refused for good; its
  lock held by another git process is "not now".
* observe: ``git ls-remote REMOTE refs/tags/TAG refs/tags/TAG^{} refs/heads/BRANCH``.
  Present when the remote's tag names a commit that carries the key's
  trailer (the commit is fetched when this repository does not hold it);
  absent when the answer shows no such tag, or a tag at a commit of another
  key (the push would be refused); unknown when the lookup failed. The
  answer lists every ref asked for, so an absence is one it could have shown;
  the lifecycle believes it only once no earlier call can still land.

Invariants kept here:

* **One release commit per key.** A call finds the key's commit before it
  makes one (a kill after the commit, after the tag, or mid-push, leaves them
  to the next call), and a second push of that commit and tag changes nothing
  at the remote: the runner's retries never make a second release.
* **Nothing starts past the call's deadline.** Right before each command, the
  registered call's deadline and the call's own time are checked; past either,
  nothing more runs: before the push, the call raises
  :class:`~runner.calls.target.NotApplied` (nothing was sent).
* **Between two commands, the call is its caller's.** Once a command ended,
  the call's record names no process again
  (:meth:`runner.calls.inflight.Registry.command_ended`): it lives while the
  caller does, until its deadline, so whoever takes over from a caller that
  was stopped waits for it, not only for a command that ended.
* **No password reaches the run.** The contract may not write one in a remote's
  URL, and ``user:password@`` in git's words is replaced by ``[secret]@``
  before they are recorded.
"""

import os
import re
import shutil
import time
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..calls import inflight
from ..base.errors import InvalidInput
from ..base.workspace import resolve_inside
from ..calls.commands import MAX_RETRY_AFTER, Outcome, run_command
from ..contract.git import KEY_TRAILER, fill, ref_problem, remote_problem
from ..contract.spec import GitSpec
from ..contract.templates import expand
from ..calls.target import NotApplied, Observation, Rejected, UnknownOutcome

__all__ = ["GitAdapter", "Pushed", "push_outcome", "carries_key", "with_trailer", "scrub", "GIT_ENVIRONMENT",
           "CONNECT_FAILURES"]

#: What every git command runs with: no prompt, English words, no pager.
GIT_ENVIRONMENT = {"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never", "LC_ALL": "C", "GIT_PAGER": "cat"}
#: Variables that would make git act on another repository than the item's: never passed on.
_ELSEWHERE = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
              "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_PREFIX", "GIT_CEILING_DIRECTORIES", "LANGUAGE")
#: What git says when it could not reach the remote at all: nothing was sent.
CONNECT_FAILURES = ("could not resolve host", "could not resolve hostname", "failed to connect",
                    "couldn't connect to server", "connection refused", "no route to host", "network is unreachable")
#: What git says when another git process holds a lock of the repository: the step is made again later.
_LOCKED = (".lock': file exists", "cannot lock ref", "unable to create '")
#: The newest commits of HEAD looked through for the key's commit.
RECENT_COMMITS = 20
#: ``retry after N`` (seconds) in a refusal's words.
_RETRY_AFTER = re.compile(r"retry[- _]after\W{0,3}([0-9]{1,6}(?:\.[0-9]+)?)", re.IGNORECASE)
#: ``scheme://user:password@`` (or ``user@``) in git's words.
_USERINFO = re.compile(r"(://)[^/@\s]+@")
#: One line of ``git ls-remote``: an object name and a ref.
_LISTED = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})\t(\S+)$")
_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def scrub(text: str) -> str:
    """``text`` with any ``user:password@`` of a URL replaced by ``[secret]@``."""
    return _USERINFO.sub(r"\1[secret]@", text)


def with_trailer(message: str, key: str) -> str:
    """``message`` with ``Runner-Key: KEY`` as its last trailer: added to its trailer block if it ends with one."""
    body = message.rstrip()
    last = body.rsplit("\n\n", 1)[-1] if "\n\n" in body else ""
    trailer = f"{KEY_TRAILER}: {key}"
    if last and all(re.match(r"^[A-Za-z0-9-]+: \S", line) for line in last.split("\n")):
        return f"{body}\n{trailer}\n"
    return f"{body}\n\n{trailer}\n"


def carries_key(message: str, key: str) -> bool:
    """Whether a commit's ``message`` holds ``Runner-Key: KEY`` in its last paragraph (its trailers)."""
    last = message.strip().rsplit("\n\n", 1)[-1]
    return f"{KEY_TRAILER}: {key}" in (line.strip() for line in last.split("\n"))


class Pushed(NamedTuple):
    """What a push's answer means: ``receipt``, ``not-now``, ``rejected``, ``not-sent`` or ``unknown``."""

    word: str
    detail: str
    retry_after: Optional[float] = None
    refs: Tuple[str, ...] = ()


def push_outcome(outcome: Outcome, not_now: Sequence[str]) -> Pushed:
    """What ``git push --porcelain``'s ``outcome`` means (see the module docstring), with git's words.

    A refusal's words are those of the remote (its ``remote:`` lines) and of each refused ref; a refusal before
    anything was sent (a ``pre-push`` hook) is read from git's own words.
    """
    out = outcome.stdout.decode("utf-8", "replace").splitlines()
    err = outcome.stderr.decode("utf-8", "replace").splitlines()
    refs = tuple(line for line in out if line.count("\t") >= 2)
    said = [line[len("remote:"):].strip() for line in err if line.startswith("remote:")]
    said = [line for line in said if line]
    if outcome.timed_out:
        return Pushed("unknown", scrub(f"git push timed out after {outcome.seconds:.0f}s: {outcome.tail()}"), refs=refs)
    if outcome.exit_code == 0:
        return Pushed("receipt", "", refs=refs)
    refused = [_refused(line) for line in refs if line.startswith("!")]
    local = not refs and outcome.exit_code == 1 and any("failed to push some refs" in line for line in err) \
        and not any(line.startswith("fatal:") for line in err)
    if refused or local:
        words = "; ".join(said + refused) if refused else " | ".join(line for line in err if line.strip())
        detail = scrub(f"git push refused: {words}"[:1500])
        lowered = words.lower()
        if any(phrase.lower() in lowered for phrase in not_now):
            asked = _RETRY_AFTER.search(words)
            wait = float(asked.group(1)) if asked else None
            return Pushed("not-now", detail, wait if wait is not None and wait <= MAX_RETRY_AFTER else None, refs)
        return Pushed("rejected", detail, refs=refs)
    text = " | ".join(line for line in err if line.strip())
    if not refs and not said and any(phrase in text.lower() for phrase in CONNECT_FAILURES):
        return Pushed("not-sent", scrub(f"git push reached no remote: {text}"[:1500]))
    if not refs and ("does not appear to be a git repository" in text or "does not support --atomic" in text):
        return Pushed("rejected", scrub(f"git push refused: {text}"[:1500]))
    return Pushed("unknown", scrub(f"git push exited {outcome.exit_code}: {text}"[:1500]), refs=refs)


def _refused(line: str) -> str:
    """A refused ref's line of ``git push --porcelain`` (``!<TAB>FROM:TO<TAB>[rejected] (why)``) as
    ``TO [rejected] (why)``."""
    _, refs, summary = line.split("\t", 2)
    return f"{refs.rpartition(':')[2]} {summary}"


class _Late(Exception):
    """The call's time ran out before a command could start: nothing more runs."""


class _Release(NamedTuple):
    """What one item's release is, its templates filled: the tag, the commit's message, the files and their contents."""

    tag: str
    message: str
    files: Tuple[Tuple[str, str], ...]


class GitAdapter:
    """The contract's ``effects.git`` as a :class:`runner.calls.target.Adapter` for one item (see the module docstring).

    :param spec: the ``effects.git`` section.
    :param values: the item's placeholders (``item``, ``stem``, ``slug``, ``index``) and ``run_id``.
    :param workspace: the folder ``repository`` is relative to.
    :param timeout: seconds one call may take, all of its commands together.
    :param runner: runs one command (default :func:`runner.calls.commands.run_command`).
    :param environ: the environment git and the edit command start from (default ``os.environ``).
    :raises InvalidInput: git is not installed, the repository is not a git repository's folder inside the workspace,
        or the remote or the branch cannot be used as the item fills them.
    """

    name = "git"
    key_scope = f"the remote's tags: one release commit per key, found by its {KEY_TRAILER} trailer"
    retention_seconds: Optional[float] = None
    conflicting_payload = "refused by the runner before any call (the ledger binds a key to one payload)"
    deduplicates = False

    def __init__(self, spec: GitSpec, *, values: Optional[Mapping[str, Any]] = None, workspace: str = ".",
                 timeout: float = 60.0, runner: Optional[Callable[..., Outcome]] = None,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        self.spec = spec
        self.values = dict(values or {})
        self.workspace = os.path.abspath(workspace)
        self.timeout = float(timeout)
        self.runner = runner or run_command
        if shutil.which("git") is None:
            raise InvalidInput("effects.git needs git, which is not on PATH")
        where = fill(spec.repository, self.values)
        self.folder = resolve_inside(self.workspace, where, f"effects.git.repository {where[:80]!r}")
        if not os.path.isdir(self.folder) or not os.path.exists(os.path.join(self.folder, ".git")):
            raise InvalidInput(f"effects.git.repository {where[:80]!r} is not the folder of a git repository (it holds "
                               f"no .git) under the workspace {self.workspace}")
        self.remote, self.branch = fill(spec.remote, self.values), fill(spec.branch, self.values)
        for what, value, problem in (("remote", self.remote, remote_problem(self.remote)),
                                     ("branch", self.branch, ref_problem(self.branch))):
            if problem:
                raise InvalidInput(f"effects.git for {where[:80]!r}: the {what} {value[:80]!r} {problem}")
        base = {k: v for k, v in (os.environ if environ is None else environ).items() if k not in _ELSEWHERE}
        self.edit_env = dict(base, GIT_TERMINAL_PROMPT="0")
        self.git_env = dict(base, GIT_CEILING_DIRECTORIES=os.path.dirname(self.folder), **GIT_ENVIRONMENT)
        if spec.author is not None:
            name, email = spec.author
            for who in ("AUTHOR", "COMMITTER"):
                self.git_env[f"GIT_{who}_NAME"], self.git_env[f"GIT_{who}_EMAIL"] = name, email
        self.verification = (f"git ls-remote {self.remote} refs/tags/{spec.tag}: the tag names a commit whose message "
                             f"carries {KEY_TRAILER}: KEY")

    # -- the two calls -------------------------------------------------------------------------------
    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Find or make the release commit, tag it, push both at once (see the module docstring)."""
        end = time.monotonic() + self.timeout
        release = self._release(key, payload)
        try:
            commit, made, tagged = self._prepare(key, payload, release, end)
            argv = ["git", "push", "--atomic", "--porcelain", self.remote, f"{commit}:refs/heads/{self.branch}",
                    f"refs/tags/{release.tag}:refs/tags/{release.tag}"]
            pushed = push_outcome(self._git(argv, end), self.spec.not_now)
        except _Late as exc:
            raise NotApplied(f"the call's time ran out before {exc}; nothing was pushed") from None
        if pushed.word == "receipt":
            return {"commit": commit, "tag": release.tag, "remote": scrub(self.remote), "branch": self.branch,
                    "commit_made": made, "tag_made": tagged,
                    "pushed": [scrub(" ".join(line.split("\t"))) for line in pushed.refs][:10]}
        if pushed.word == "not-now":
            raise NotApplied(pushed.detail, pushed.retry_after)
        if pushed.word == "not-sent":
            raise NotApplied(pushed.detail)
        if pushed.word == "rejected":
            raise Rejected(pushed.detail)
        raise UnknownOutcome(pushed.detail)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """Look at the remote's tag and branch; present when the tag's commit carries the key (see the module)."""
        end = time.monotonic() + self.timeout
        try:
            tag = self._tag(key, payload)
        except Rejected as exc:
            return Observation("unknown", {"source": "git ls-remote", "remote": scrub(self.remote),
                                           "reason": str(exc)[:500]})
        evidence: Dict[str, Any] = {"source": "git ls-remote", "remote": scrub(self.remote), "tag": tag,
                                    "branch": self.branch}
        wanted = (f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}", f"refs/heads/{self.branch}")
        try:
            listed = self._git(["git", "ls-remote", self.remote, *wanted], end)
            refs = _listing(listed)
            if refs is None:
                return Observation("unknown", dict(evidence, reason=_said("git ls-remote", listed)))
            evidence["branch_at"] = refs.get(wanted[2])
            named = refs.get(wanted[0])
            if named is None:
                return Observation("absent", dict(evidence, tag_at=None))
            commit, message, why = self._remote_commit(named, refs.get(wanted[1]), tag, end)
        except _Late as exc:
            return Observation("unknown", dict(evidence, reason=f"the call's time ran out before {exc}"))
        if commit is None or message is None:
            return Observation("unknown", dict(evidence, tag_at=named, reason=why))
        evidence.update(tag_at=commit, branch_holds_it=evidence["branch_at"] == commit)
        if carries_key(message, key):
            return Observation("present", dict(evidence, trailer=f"{KEY_TRAILER}: {key}"))
        return Observation("absent", dict(evidence, reason=f"the remote's tag {tag} names commit {commit[:12]}, whose "
                                                           f"message carries no {KEY_TRAILER}: {key}"))

    # -- the steps of a call --------------------------------------------------------------------------
    def _git(self, argv: Sequence[str], end: float, env: Optional[Dict[str, str]] = None) -> Outcome:
        """Run one command of the call in the repository, with what is left of the call's time.

        :raises _Late: the call's deadline (or its own time) passed before the command could start.
        """
        making = inflight.current()
        late = making is not None and making[0].clock() >= float(making[1].record["deadline"])
        left = end - time.monotonic()
        if late or left <= 0:
            raise _Late(" ".join(argv[:2]) if argv[0] == "git" else "the edit command")
        try:
            return self.runner(list(argv), cwd=self.folder, timeout=left, env=env or self.git_env)
        except InvalidInput as exc:  # the edit command's program cannot be started: no attempt will do better
            raise Rejected(exc.message) from None
        finally:
            if making is not None:
                making[0].command_ended(making[1])

    def _filled(self, template: str, key: str, payload: Mapping[str, Any]) -> str:
        """``template`` filled from the item's placeholders, its key and its payload.

        :raises Rejected: it names a payload field the payload does not hold.
        """
        try:
            return fill(template, dict(self.values, key=key), payload)
        except KeyError as exc:
            raise Rejected(f"effects.git names {{payload.{exc.args[0]}}}, which the payload of {key!r} does not "
                           "hold") from None

    def _tag(self, key: str, payload: Mapping[str, Any]) -> str:
        """The item's tag. :raises Rejected: see :meth:`_filled`, or it is no tag's name."""
        tag = self._filled(self.spec.tag, key, payload)
        problem = ref_problem(tag)
        if problem:
            raise Rejected(f"effects.git.tag: the tag {tag[:80]!r} {problem}")
        return tag

    def _release(self, key: str, payload: Mapping[str, Any]) -> _Release:
        """The item's tag, message and files. :raises Rejected: see :meth:`_tag`."""
        files = tuple((self._filled(path, key, payload), self._filled(text, key, payload))
                      for path, text in self.spec.files)
        message = with_trailer(self._filled(self.spec.message, key, payload), key)
        return _Release(self._tag(key, payload), message, files)

    def _prepare(self, key: str, payload: Dict[str, Any], release: _Release, end: float) -> Tuple[str, bool, bool]:
        """The release commit, found or made, and tagged: ``(commit, made now, tag made now)``.

        :raises Rejected: the repository refuses: HEAD on another branch, the tag at another commit, a step git
            refuses.
        :raises NotApplied: another git process holds the repository's lock.
        """
        tagged = self._git(["git", "rev-parse", "-q", "--verify", f"refs/tags/{release.tag}^{{commit}}"], end)
        if tagged.exit_code == 0:
            commit = tagged.stdout.decode().strip()
            if not carries_key(self._message(commit, end) or "", key):
                raise Rejected(f"the tag {release.tag} already names commit {commit[:12]}, which is not this release's "
                               f"(its message carries no {KEY_TRAILER}: {key}); the runner never moves a tag")
            return commit, False, False
        head = self._git(["git", "symbolic-ref", "-q", "HEAD"], end)
        on = head.stdout.decode("utf-8", "replace").strip()
        if head.exit_code != 0 or on != f"refs/heads/{self.branch}":
            if on.startswith("refs/heads/"):
                shown = on[len("refs/heads/"):]
            else:
                shown = "detached" if head.exit_code == 1 else _said("git symbolic-ref", head)
            raise Rejected(scrub(f"the repository's HEAD is {shown}, not the branch {self.branch}: the release is "
                                 f"made on {self.branch}; check it out"))
        found = self._recent(key, end)
        made = found is None
        commit = found if found is not None else self._commit(key, payload, release, end)
        argv = ["git", "tag", "-a", "-m", release.message.split("\n", 1)[0]] if self.spec.annotated else ["git", "tag"]
        self._step(argv + [release.tag, commit], end, "git tag")
        return commit, made, True

    def _recent(self, key: str, end: float) -> Optional[str]:
        """The newest of HEAD's last :data:`RECENT_COMMITS` commits whose message carries the key, or None."""
        if self._git(["git", "rev-parse", "-q", "--verify", "HEAD"], end).exit_code != 0:
            return None  # a branch without commits yet
        listed = self._step(["git", "log", "-z", f"-n{RECENT_COMMITS}", "--format=%H%n%B", "HEAD"], end, "git log")
        for entry in listed.stdout.decode("utf-8", "replace").split("\0"):
            commit, _, message = entry.strip("\n").partition("\n")
            if _SHA.match(commit) and carries_key(message, key):
                return commit
        return None

    def _commit(self, key: str, payload: Dict[str, Any], release: _Release, end: float) -> str:
        """Write the files, run the edit command, and commit what they changed with the message; the new commit.

        With ``files`` alone, the commit holds those files only (``--only``: what else the index holds stays staged);
        with ``edit``, everything changed in the working tree; with neither, nothing (an empty release commit).
        """
        for path, text in release.files:
            self._write(path, text)
        paths = [path for path, _ in release.files]
        if self.spec.edit is not None:
            with inflight.payload_file(payload) as payload_file:
                values = dict(self.values, key=key, payload_file=payload_file, workspace=self.workspace,
                              repository=self.folder)
                edited = self._git(expand(self.spec.edit, values), end, env=self.edit_env)
            if edited.timed_out:
                raise _Late("the edit command ended")
            if edited.exit_code != 0:
                raise Rejected(scrub(f"the edit command exited {edited.exit_code}: {edited.tail()}"))
        # The edit command may change any file: then everything changed is the release.
        which = ["."] if self.spec.edit is not None else paths
        if which:
            self._step(["git", "add", "-A", "--"] + which, end, "git add")
        only = [] if self.spec.edit is not None else ["--only", "--"] + paths
        self._step(["git", "commit", "-q", "--allow-empty", "-m", release.message] + only, end, "git commit")
        return self._step(["git", "rev-parse", "-q", "--verify", "HEAD"], end, "git rev-parse").stdout.decode().strip()

    def _write(self, path: str, text: str) -> None:
        """Write one file of the release whole, inside the repository (its mode kept).

        :raises Rejected: the path leads outside the repository or into ``.git``, or cannot be written.
        """
        try:
            real = resolve_inside(self.folder, path, f"effects.git.files {path[:80]!r}")
        except InvalidInput as exc:
            raise Rejected(exc.message) from None
        inside = os.path.relpath(real, os.path.realpath(self.folder)).replace(os.sep, "/")
        if inside == ".git" or inside.startswith(".git/"):
            raise Rejected(f"effects.git.files {path[:80]!r} leads into .git")
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            with open(real, "w", encoding="utf-8", newline="") as handle:
                handle.write(text)
        except OSError as exc:
            raise Rejected(f"effects.git.files {path[:80]!r} cannot be written: {exc.strerror or exc}") from None

    def _step(self, argv: Sequence[str], end: float, what: str) -> Outcome:
        """A local step of the release; it must succeed.

        :raises NotApplied: another git process holds the repository's lock (nothing was pushed).
        :raises Rejected: git refuses it, with git's words.
        :raises _Late: it ran out of the call's time.
        """
        done = self._git(argv, end)
        if done.timed_out:
            raise _Late(f"{what} ended")
        if done.exit_code != 0:
            text = _said(what, done)
            if any(phrase in text.lower() for phrase in _LOCKED):
                raise NotApplied(f"{text}; another git process holds the repository's lock: nothing was pushed")
            raise Rejected(text)
        return done

    def _message(self, commit: str, end: float) -> Optional[str]:
        """The message of ``commit`` as this repository holds it, or None when it holds no such commit."""
        shown = self._git(["git", "cat-file", "commit", commit], end)
        if shown.exit_code != 0:
            return None
        text = shown.stdout.decode("utf-8", "replace")
        return text.split("\n\n", 1)[1] if "\n\n" in text else ""

    def _remote_commit(self, named: str, peeled: Optional[str], tag: str,
                       end: float) -> Tuple[Optional[str], Optional[str], str]:
        """``(commit, its message, why not)`` of the remote's tag (``named``, its object; ``peeled``, its commit if the
        answer said), fetched from the remote when this repository does not hold it."""
        commit, message = self._read(peeled or named, end)
        if message is None:
            fetched = self._git(["git", "fetch", "-q", "--no-tags", self.remote, f"refs/tags/{tag}"], end)
            if fetched.exit_code != 0:
                return None, None, _said("git fetch", fetched)
            commit, message = self._read(peeled or named, end)
        return commit, message, "" if message is not None else "the tag's commit cannot be read, even after a fetch"

    def _read(self, name: str, end: float) -> Tuple[Optional[str], Optional[str]]:
        """The commit ``name`` (a commit or a tag object) names and its message, as far as this repository holds
        them."""
        found = self._git(["git", "rev-parse", "-q", "--verify", f"{name}^{{commit}}"], end)
        commit = found.stdout.decode().strip() if found.exit_code == 0 else None
        return commit, self._message(commit, end) if commit else None


def _listing(outcome: Outcome) -> Optional[Dict[str, str]]:
    """The refs ``git ls-remote`` answered, by name; None when it failed or answered something else."""
    if outcome.timed_out or outcome.exit_code != 0:
        return None
    refs: Dict[str, str] = {}
    for line in outcome.stdout.decode("utf-8", "replace").splitlines():
        found = _LISTED.match(line)
        if found is None:
            return None
        refs[found.group(2)] = found.group(1)
    return refs


def _said(what: str, outcome: Outcome) -> str:
    """What a failed command said, one line, with any password replaced."""
    if outcome.timed_out:
        return f"{what} timed out after {outcome.seconds:.0f}s"
    return scrub(f"{what} exited {outcome.exit_code}: {outcome.tail()}")
