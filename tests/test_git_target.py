"""git as a target (``effects.git``, ``runner/adapters/git.py``), against real repositories.

Each test makes bare repositories in a scratch folder as remotes, with hooks
that refuse ("try again later") a number of times, accept slowly, or kill the
server mid-push, and working repositories that push to them. What is proven:
the section's checks name each problem's field; a push's answer means what the
module says (receipt, "not now" with the delay a hook names, a refusal with
git's words, nothing sent, unknown); the release commit and its tag are found
again after a kill, never made twice, and a tag at another commit is refused,
never moved; a lookup is present only when the remote's tag names a commit
that carries the key's trailer; nothing starts past a call's deadline; and a
real ``drive`` over twelve repositories, SIGKILLed twice while pushes are on
their way and resumed in other processes, leaves each remote with exactly one
release commit and one tag. The recipe ``templates/recipes/git-release.md`` is
checked and run as a user runs it.
"""

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import unittest
from typing import Any, Dict, List, Optional

from runner.adapters.git import GitAdapter, carries_key, push_outcome, with_trailer
from runner.base.errors import InvalidInput
from runner.calls import inflight
from runner.calls.commands import Outcome
from runner.calls.target import NotApplied, Rejected, UnknownOutcome
from runner.contract import spec as specs
from runner.contract.git import fill, git_problems
from runner.contract.templates import item_values
from runner.contract.text import check_contract, parse_contract_text
from runner.proof.cli import add_proof_verbs
from runner.surfaces.cli import build_parser, split_command
from tests.support.cli import RunnerCli
from tests.support.util import child_env, contract_markdown, REPO_ROOT, scratch_dir, wait_for
from tests.test_skill import shown_commands

RECIPE = os.path.join(REPO_ROOT, "templates", "recipes", "git-release.md")
#: The tests that run git need it installed; the runner itself does not, unless a contract names effects.git.
HAS_GIT = shutil.which("git") is not None
KEY = "api:v2.3.0"
PAYLOAD = {"version": "2.3.0"}
#: What git reads in every test: no user's or system's configuration, no prompt, English words.
ISOLATED = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
GIT_ENV = dict({k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **ISOLATED)
IDENTITY = {"GIT_AUTHOR_NAME": "Tester", "GIT_AUTHOR_EMAIL": "tester@example.invalid",
            "GIT_COMMITTER_NAME": "Tester", "GIT_COMMITTER_EMAIL": "tester@example.invalid"}


def git(cwd: str, *args: str) -> str:
    """Run git in ``cwd`` (isolated from the user's configuration); its stdout. Fails the test on a non-zero exit."""
    done = subprocess.run(["git", *args], cwd=cwd, env=dict(GIT_ENV, **IDENTITY), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} exited {done.returncode}: {done.stderr.decode()}")
    return done.stdout.decode()


def hook(refuse: int = 0, words: str = "the server is busy: try again later", sleep: float = 0.0,
         kill: bool = False) -> str:
    """A pre-receive hook: it refuses the first ``refuse`` pushes with ``words``, then logs each push it lets through
    (``start``, then ``end`` once it slept ``sleep`` seconds) in ``pushes.log``; with ``kill`` it kills the server
    process instead (the client's connection is lost mid-push)."""
    lines = ["#!/bin/sh", "cat >/dev/null", 'n=$(cat refusals 2>/dev/null || echo 0)',
             f'if [ "$n" -lt {refuse} ]; then echo $((n + 1)) > refusals; echo {shlex.quote(words)} >&2; exit 1; fi']
    if kill:
        lines.append("kill -9 $PPID; sleep 5")
    lines += ["echo start >> pushes.log", f"sleep {sleep}" if sleep else ":", "echo end >> pushes.log"]
    return "\n".join(lines) + "\n"


def make_remote(root: str, name: str) -> str:
    """A bare repository ``ROOT/remotes/NAME.git`` on ``main``, without hooks."""
    path = os.path.join(root, "remotes", name + ".git")
    os.makedirs(path)
    git(path, "init", "-q", "--bare")
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    return path


def install_hooks(remote: str, pre_receive: Optional[str] = None) -> None:
    """``remote``'s hooks from now on: ``pre_receive`` (if any), and a post-receive hook that logs in ``landed.log``
    each push that landed."""
    landed = "#!/bin/sh\ncat >/dev/null\necho landed >> landed.log\n"
    for which, text in (("post-receive", landed), ("pre-receive", pre_receive)):
        if text:
            path = os.path.join(remote, "hooks", which)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(path, 0o755)


def make_clone(root: str, name: str, remote: str) -> str:
    """A working repository ``ROOT/repos/NAME`` on ``main`` whose first commit is pushed to ``remote``."""
    path = os.path.join(root, "repos", name)
    os.makedirs(path)
    git(path, "init", "-q")
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    git(path, "config", "user.name", "Tester")
    git(path, "config", "user.email", "tester@example.invalid")
    git(path, "remote", "add", "origin", remote)
    with open(os.path.join(path, "VERSION"), "w", encoding="utf-8") as handle:
        handle.write("2.2.0\n")
    git(path, "add", "VERSION")
    git(path, "commit", "-q", "-m", "start")
    git(path, "push", "-q", "origin", "main")
    return path


def releases(repository: str, ref: str = "main") -> List[str]:
    """The commits of ``ref`` whose message carries a ``Runner-Key`` trailer, newest first."""
    out = git(repository, "log", "-z", "--format=%H%n%B", ref)
    return [e.strip("\n").split("\n", 1)[0] for e in out.split("\0") if "Runner-Key: " in e]


def tags(repository: str) -> List[str]:
    return git(repository, "for-each-ref", "--format=%(refname)", "refs/tags").split()


def lines(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().split()
    except FileNotFoundError:
        return []




def outcome(code: Optional[int], out: str = "", err: str = "", timed_out: bool = False) -> Outcome:
    return Outcome(["git", "push"], code, timed_out, out.encode(), err.encode(), "", "", 1.0)


def section(**fields: Any) -> Dict[str, Any]:
    """An ``effects.git`` section: the release of version 2.3.0 with its VERSION file, then ``fields``."""
    made: Dict[str, Any] = {"files": {"VERSION": "{payload.version}\n"}, "message": "Release {payload.version}",
                            "tag": "v{payload.version}", "remote": "origin", "branch": "main"}
    made.update(fields)
    return {k: v for k, v in made.items() if v is not None}


def release_contract(git_section: Dict[str, Any], **effects: Any) -> Dict[str, Any]:
    """A contract that releases 2.3.0 in every folder of ``repos/`` through ``git_section``, ``effects`` beside it."""
    return {"contract": 1, "task_id": "release", "goal": "release 2.3.0 everywhere",
            "steps": [{"id": "release", "items": {"glob": "repos/*/"}, "key": "{slug}:v2.3.0",
                       "payload": {"template": {"version": "2.3.0"}}, "next": "done"}],
            "effects": dict({"git": git_section}, **effects), "retry": {"base_seconds": 0.05, "cap_seconds": 0.2}}


class ContractTest(unittest.TestCase):
    """``contract check`` of the section: each problem on its field's line; the spec carries the defaults."""

    def problems(self, contract: Dict[str, Any]) -> List[str]:
        text = contract_markdown(json.dumps(contract, indent=2))
        return [f"{p.line}: {p.message}" for p in parse_contract_text(text)[1]]

    def test_a_release_reads_as_its_spec_with_the_defaults(self) -> None:
        least = {"message": "Release {payload.version}", "tag": "v{payload.version}", "branch": "main"}
        contract = release_contract(least)
        self.assertEqual(self.problems(contract), [])
        made = specs.read_contract(contract).effects
        self.assertEqual(made.git, specs.GitSpec(**least))
        self.assertEqual((made.git.repository, made.git.remote, made.git.annotated, made.git.not_now, made.git.files,
                          made.git.edit, made.git.author),
                         ("{item}", "origin", True, ("try again later", "temporarily"), (), None, None))
        self.assertTrue(made.performs_effects)
        full = specs.read_contract(release_contract(section(
            repository="src/{stem}", edit=["tool", "{payload_file}"], annotated=False, not_now=["busy"],
            author={"name": "Release Bot", "email": "bot@example.invalid"}))).effects.git
        self.assertEqual((full.repository, full.files, full.edit, full.annotated, full.not_now, full.author),
                         ("src/{stem}", (("VERSION", "{payload.version}\n"),), ("tool", "{payload_file}"), False,
                          ("busy",), ("Release Bot", "bot@example.invalid")))

    def test_each_problem_names_its_field_on_its_line(self) -> None:
        cases = [
            ({"tag": None}, "effects.git needs 'tag'"),
            ({"branch": None}, "effects.git needs 'branch'"),
            ({"message": None}, "effects.git needs 'message'"),
            ({"tagg": "x"}, "effects.git: unknown field 'tagg'"),
            ({"tag": "v {payload.version}"}, "effects.git.tag 'v {payload.version}' holds a space"),
            ({"tag": "-{payload.version}"}, "starts with '-'"),
            ({"tag": "v{payload.version}.lock"}, "ends with '/', '.' or '.lock'"),
            ({"tag": "v{epoch}"}, "effects.git.tag: unknown placeholder {epoch}"),
            ({"branch": "rel..x"}, "effects.git.branch 'rel..x' holds '..'"),
            ({"branch": "{payload.branch}"}, "effects.git.branch: unknown placeholder {payload.branch}"),
            ({"remote": "https://bot:hunter2@git.example/x.git"}, "effects.git.remote holds a password"),
            ({"remote": "https://ghp_0123456789@github.com/o/r.git"}, "effects.git.remote holds a password or a token"),
            ({"remote": "--upload-pack=evil"}, "effects.git.remote must name a remote"),
            ({"repository": "../elsewhere/{stem}"}, "effects.git.repository must be a folder relative to the"),
            ({"files": {".git/hooks/pre-push": "x"}}, "must be a path relative to the repository, without '..' and "
                                                      "outside .git"),
            ({"files": {"../VERSION": "x"}}, "without '..'"),
            ({"files": {"VERSION": 3}}, "the content of 'VERSION' must be a string"),
            ({"files": {}}, "effects.git.files must be an object of paths"),
            ({"edit": "bump.sh"}, "effects.git.edit must be a non-empty list of strings"),
            ({"edit": ["bump", "{payload}"]}, "effects.git.edit: unknown placeholder {payload}"),
            ({"annotated": "yes"}, "effects.git.annotated must be true"),
            ({"not_now": ["busy\nnow"]}, "effects.git.not_now must list the phrases"),
            ({"author": {"name": "Bot"}}, "effects.git.author must be"),
        ]
        for change, expected in cases:
            with self.subTest(change=change):
                contract = release_contract(section(**change))
                found = self.problems(contract)
                self.assertTrue(any(expected in p for p in found), found)
                field, value = next(iter(change.items()))
                if value is not None:
                    # On the field's line; a problem of one file, on that file's line.
                    named = next(iter(value)) if isinstance(value, dict) and field == "files" and value else field
                    text = contract_markdown(json.dumps(contract, indent=2)).splitlines()
                    line = int(next(p for p in found if expected in p).split(":")[0])
                    self.assertIn(f'"{named}"', text[line - 1], "the problem is on its field's line")

    def test_git_excludes_http_and_commands_and_payload_fields_are_checked_against_the_template(self) -> None:
        self.assertIn("effects: git and invoke/observe exclude each other; keep one of them",
                      " ".join(self.problems(release_contract(section(), invoke=["a"], observe=["b"]))))
        self.assertIn("effects: git and http exclude each other",
                      " ".join(git_problems({"git": section(), "http": {}})))
        wrong = release_contract(section(tag="v{payload.verison}"))
        self.assertEqual([p.split(": ", 1)[1] for p in self.problems(wrong)],
                         ["effects.git names {payload.verison}, which the payload of step 'release' does not hold "
                          "(it holds: version)"])
        by_command = release_contract(section(tag="v{payload.verison}"))
        by_command["steps"][0]["payload"] = {"command": ["make-payload", "{key}"]}
        self.assertEqual(self.problems(by_command), [], "a payload made by a command is known when its item begins")

    def test_templates_fill_payload_fields_once_and_leave_unknown_braces(self) -> None:
        values = dict(item_values("repos/api", 3), key=KEY)
        self.assertEqual(fill("{stem}-{index:03d} {payload.version} {payload.n} {payload.notes} {other}", values,
                              {"version": "2.3.0", "n": 7, "notes": "{stem}"}), "api-003 2.3.0 7 {stem} {other}")
        with self.assertRaises(KeyError):
            fill("v{payload.version}", values, {})


class AnswersTest(unittest.TestCase):
    """What a push's answer means, and the key's trailer, as pure functions."""

    def test_a_push_answer_means_what_the_module_says(self) -> None:
        refused = "To r.git\n!\tX:refs/heads/main\t[remote rejected] (pre-receive hook declined)\nDone\n"
        cases = [
            (outcome(0, "To r.git\n*\tX:refs/heads/main\t[new branch]\nDone\n"), "receipt", None),
            (outcome(1, refused, "remote: busy: try again later   \nerror: failed to push some refs\n"),
             "not-now", None),
            (outcome(1, refused, "remote: busy, try again later (retry after 7 seconds)\n"), "not-now", 7.0),
            (outcome(1, refused, "remote: Service Temporarily Unavailable\n"), "not-now", None),
            (outcome(1, refused, "remote: release branch is frozen\n"), "rejected", None),
            (outcome(1, "To r.git\n!\tX:refs/heads/main\t[rejected] (non-fast-forward)\nDone\n", "hint: ...\n"),
             "rejected", None),
            (outcome(1, "", "pre-push: try again later\nerror: failed to push some refs to 'r.git'\n"),
             "not-now", None),
            (outcome(1, "", "pre-push: no\nerror: failed to push some refs to 'r.git'\n"), "rejected", None),
            (outcome(128, "", "fatal: unable to access 'https://h/x.git/': Could not resolve host: h\n"),
             "not-sent", None),
            (outcome(128, "", "fatal: unable to access 'http://127.0.0.1:9/x/': Failed to connect to 127.0.0.1"),
             "not-sent", None),
            (outcome(128, "", "fatal: 'nowhere' does not appear to be a git repository\n"), "rejected", None),
            (outcome(128, "", "send-pack: unexpected disconnect while reading sideband packet\n"
                               "fatal: the remote end hung up unexpectedly\n"), "unknown", None),
            (outcome(None, "", "", timed_out=True), "unknown", None),
            (outcome(1, "To r.git\n=\tX:refs/heads/main\t[up to date]\nDone\n", "error: something odd\n"),
             "unknown", None),
        ]
        for answer, word, wait in cases:
            with self.subTest(err=answer.stderr[:60], word=word):
                pushed = push_outcome(answer, specs.NOT_NOW_DEFAULT)
                self.assertEqual((pushed.word, pushed.retry_after), (word, wait), pushed.detail)
        frozen = outcome(1, refused, "remote: release branch is frozen\n")
        self.assertEqual(push_outcome(frozen, ("frozen",)).word, "not-now", "the contract's own phrases")
        lost = outcome(128, "", "fatal: unable to access 'https://bot:s3cret@h/x.git/': Could not resolve host")
        said = push_outcome(lost, specs.NOT_NOW_DEFAULT).detail
        self.assertNotIn("s3cret", said)
        self.assertIn("https://[secret]@h/x.git/", said)

    def test_the_key_goes_in_the_last_trailer_block(self) -> None:
        self.assertEqual(with_trailer("Release 2.3.0", KEY), f"Release 2.3.0\n\nRunner-Key: {KEY}\n")
        signed = with_trailer("Release 2.3.0\n\nSigned-off-by: A <a@x>\n", KEY)
        self.assertEqual(signed, f"Release 2.3.0\n\nSigned-off-by: A <a@x>\nRunner-Key: {KEY}\n")
        self.assertTrue(carries_key(signed, KEY))
        self.assertFalse(carries_key(signed, "api:v2.3"), "a key is matched whole")
        self.assertFalse(carries_key(f"Runner-Key: {KEY} was said here\n\nbody", KEY), "only a trailer counts")


@unittest.skipUnless(HAS_GIT, "git is not installed")
class Repositories(unittest.TestCase):
    """A workspace with ``repos/api`` (a working repository) pushing to ``remotes/api.git``."""

    def setUp(self) -> None:
        scratch = scratch_dir("runner-git-")
        self.addCleanup(scratch.cleanup)
        self.root = scratch.name
        self.remote = make_remote(self.root, "api")
        self.work = make_clone(self.root, "api", self.remote)
        install_hooks(self.remote)

    def adapter(self, timeout: float = 30.0, **fields: Any) -> GitAdapter:
        made = specs.read_contract(release_contract(section(**fields))).effects.git
        assert made is not None
        values = dict(item_values("repos/api", 0), run_id="release")
        return GitAdapter(made, values=values, workspace=self.root, timeout=timeout, environ=GIT_ENV)

    def set_hook(self, text: str) -> None:
        install_hooks(self.remote, text)


class InvokeTest(Repositories):
    def test_one_commit_one_tag_both_pushed_and_the_lookup_sees_them(self) -> None:
        adapter = self.adapter()
        self.assertEqual(adapter.observe(KEY, PAYLOAD).status, "absent")
        receipt = adapter.invoke(KEY, PAYLOAD, 1)
        self.assertEqual((receipt["tag"], receipt["branch"], receipt["commit_made"], receipt["tag_made"]),
                         ("v2.3.0", "main", True, True))
        self.assertEqual(releases(self.remote), [receipt["commit"]])
        self.assertEqual(git(self.remote, "rev-parse", "v2.3.0^{commit}").strip(), receipt["commit"])
        self.assertEqual(git(self.remote, "cat-file", "-t", "v2.3.0").strip(), "tag", "an annotated tag by default")
        self.assertEqual(git(self.remote, "show", "main:VERSION"), "2.3.0\n")
        message = git(self.remote, "log", "-1", "--format=%B", "main")
        self.assertEqual(message.strip(), f"Release 2.3.0\n\nRunner-Key: {KEY}")
        seen = adapter.observe(KEY, PAYLOAD)
        self.assertEqual(seen.status, "present")
        self.assertEqual((seen.evidence["tag_at"], seen.evidence["branch_at"], seen.evidence["trailer"]),
                         (receipt["commit"], receipt["commit"], f"Runner-Key: {KEY}"))
        again = adapter.invoke(KEY, PAYLOAD, 1)
        self.assertEqual((again["commit"], again["commit_made"], again["tag_made"]), (receipt["commit"], False, False))
        self.assertEqual(lines(os.path.join(self.remote, "landed.log")), ["landed"], "a second push changes nothing")

    def test_a_commit_or_a_tag_left_by_a_killed_call_is_reused(self) -> None:
        adapter = self.adapter()
        git(self.work, "commit", "-q", "--allow-empty", "-m", f"Release 2.3.0\n\nRunner-Key: {KEY}")
        left = git(self.work, "rev-parse", "HEAD").strip()
        git(self.work, "commit", "-q", "--allow-empty", "-m", "someone's work after it")
        receipt = adapter.invoke(KEY, PAYLOAD, 1)
        self.assertEqual((receipt["commit"], receipt["commit_made"], receipt["tag_made"]), (left, False, True))
        self.assertEqual(releases(self.work), [left], "no second commit carries the key")
        self.assertEqual(git(self.remote, "rev-parse", "main").strip(), left, "the release commit itself is pushed")

    def test_a_tag_at_another_commit_is_refused_and_never_moved(self) -> None:
        git(self.work, "tag", "v2.3.0")
        before = git(self.work, "rev-parse", "v2.3.0").strip()
        refused = r"the tag v2\.3\.0 already names commit [0-9a-f]{12}, which is not this release's"
        with self.assertRaisesRegex(Rejected, refused):
            self.adapter().invoke(KEY, PAYLOAD, 1)
        self.assertEqual(git(self.work, "rev-parse", "v2.3.0").strip(), before)
        self.assertEqual(releases(self.work), [], "nothing was committed")
        self.assertEqual(tags(self.remote), [])

    def test_a_hook_that_says_try_again_later_is_not_now_until_it_accepts(self) -> None:
        self.set_hook(hook(refuse=2, words="busy: try again later (retry after 3 seconds)"))
        adapter = self.adapter()
        for _ in range(2):
            with self.assertRaisesRegex(NotApplied, "try again later") as caught:
                adapter.invoke(KEY, PAYLOAD, 1)
            self.assertEqual(caught.exception.retry_after, 3.0)
            self.assertEqual(adapter.observe(KEY, PAYLOAD).status, "absent", "nothing landed")
        receipt = adapter.invoke(KEY, PAYLOAD, 1)
        self.assertEqual((receipt["commit_made"], receipt["tag_made"]), (False, False), "made once, by the first call")
        self.assertEqual(releases(self.remote), [receipt["commit"]])

    def test_a_hook_s_other_words_and_a_non_fast_forward_are_refusals_with_git_s_words(self) -> None:
        self.set_hook(hook(refuse=1, words="the release branch is frozen"))
        with self.assertRaisesRegex(Rejected, "the release branch is frozen"):
            self.adapter().invoke(KEY, PAYLOAD, 1)
        self.assertEqual(self.adapter(not_now=["frozen"]).observe(KEY, PAYLOAD).status, "absent")
        other = os.path.join(self.root, "other")
        git(self.root, "clone", "-q", self.remote, other)
        git(other, "commit", "-q", "--allow-empty", "-m", "someone else's")
        git(other, "push", "-q", "origin", "main")
        with self.assertRaisesRegex(Rejected, r"refs/heads/main \[rejected\] \(fetch first\)"):
            self.adapter().invoke(KEY, PAYLOAD, 1)
        git(self.work, "fetch", "-q", "origin")
        with self.assertRaisesRegex(Rejected, r"refs/heads/main \[rejected\] \(non-fast-forward\)"):
            self.adapter().invoke(KEY, PAYLOAD, 1)
        self.assertEqual(tags(self.remote), [], "neither ref moved: the push is atomic")

    def test_a_connection_lost_mid_push_is_unknown_and_nothing_reached_is_not_applied(self) -> None:
        self.set_hook(hook(kill=True))
        with self.assertRaises(UnknownOutcome):
            self.adapter().invoke(KEY, PAYLOAD, 1)
        self.assertEqual(self.adapter().observe(KEY, PAYLOAD).status, "absent")
        with self.assertRaisesRegex(NotApplied, "reached no remote"):
            self.adapter(remote="http://127.0.0.1:9/x.git").invoke(KEY, PAYLOAD, 1)
        seen = self.adapter(remote=os.path.join(self.root, "gone.git")).observe(KEY, PAYLOAD)
        self.assertEqual(seen.status, "unknown", "a lookup that failed says nothing")
        self.assertIn("git ls-remote exited 128", seen.evidence["reason"])

    def test_the_lookup_fetches_a_commit_it_lacks_and_a_tag_of_another_key_is_absent(self) -> None:
        elsewhere = os.path.join(self.root, "elsewhere")
        git(self.root, "clone", "-q", self.remote, elsewhere)
        git(elsewhere, "commit", "-q", "--allow-empty", "-m", f"Release 2.3.0\n\nRunner-Key: {KEY}")
        git(elsewhere, "tag", "-a", "-m", "Release 2.3.0", "v2.3.0")
        git(elsewhere, "push", "-q", "--atomic", "origin", "main", "v2.3.0")
        commit = git(elsewhere, "rev-parse", "HEAD").strip()
        with self.assertRaises(AssertionError):
            git(self.work, "cat-file", "-e", commit)  # this repository does not hold it
        seen = self.adapter().observe(KEY, PAYLOAD)
        self.assertEqual((seen.status, seen.evidence["tag_at"]), ("present", commit), seen.evidence)
        other = self.adapter().observe("web:v2.3.0", PAYLOAD)
        self.assertEqual(other.status, "absent")
        self.assertIn("carries no Runner-Key: web:v2.3.0", other.evidence["reason"])

    def test_head_on_another_branch_a_missing_payload_field_and_a_bad_folder_are_refused(self) -> None:
        git(self.work, "checkout", "-q", "-b", "feature")
        with self.assertRaisesRegex(Rejected, "the repository's HEAD is feature, not the branch main"):
            self.adapter().invoke(KEY, PAYLOAD, 1)
        git(self.work, "checkout", "-q", "main")
        with self.assertRaisesRegex(Rejected, r"effects.git names \{payload.version\}, which the payload of"):
            self.adapter().invoke(KEY, {"v": 1}, 1)
        os.makedirs(os.path.join(self.root, "repos", "plain"))
        made = specs.GitSpec(message="m", tag="t", branch="main")
        with self.assertRaisesRegex(InvalidInput, "'repos/plain' is not the folder of a git repository"):
            GitAdapter(made, values=item_values("repos/plain", 1), workspace=self.root, environ=GIT_ENV)
        with self.assertRaisesRegex(InvalidInput, "the remote '-api' must name a remote"):
            GitAdapter(dataclasses.replace(made, remote="-{stem}"), values=item_values("repos/api", 0),
                       workspace=self.root, environ=GIT_ENV)

    def test_an_edit_command_reads_the_payload_and_everything_it_changed_is_committed(self) -> None:
        tool = os.path.join(self.root, "bump.py")
        with open(tool, "w", encoding="utf-8") as handle:
            handle.write("import json, sys\n"
                         "version = json.load(open(sys.argv[1]))['version']\n"
                         "open('VERSION', 'w').write(version + '\\n')\n"
                         "open('CHANGES', 'w').write(sys.argv[2] + '\\n')\n")
        import sys

        adapter = self.adapter(files=None, edit=[sys.executable, tool, "{payload_file}", "{key} in {stem}"])
        receipt = adapter.invoke(KEY, PAYLOAD, 1)
        self.assertEqual(git(self.remote, "show", f"{receipt['commit']}:VERSION"), "2.3.0\n")
        self.assertEqual(git(self.remote, "show", f"{receipt['commit']}:CHANGES"), f"{KEY} in api\n")

    def test_files_alone_commit_only_themselves_and_neither_makes_an_empty_release(self) -> None:
        with open(os.path.join(self.work, "notes"), "w", encoding="utf-8") as handle:
            handle.write("not for the release\n")
        git(self.work, "add", "notes")
        receipt = self.adapter(annotated=False).invoke(KEY, PAYLOAD, 1)
        self.assertEqual(git(self.work, "show", "--name-only", "--format=", receipt["commit"]).split(), ["VERSION"])
        self.assertEqual(git(self.work, "diff", "--cached", "--name-only").split(), ["notes"],
                         "what was staged stays staged")
        self.assertEqual(git(self.remote, "cat-file", "-t", "v2.3.0").strip(), "commit", "a lightweight tag")
        empty = self.adapter(files=None, tag="empty-{payload.version}").invoke("api:empty", PAYLOAD, 1)
        self.assertEqual(git(self.work, "show", "--name-only", "--format=", empty["commit"]).split(), [])


class CallsInFlightTest(Repositories):
    """The call's registration: nothing starts past its deadline, and between two commands it is its caller's."""

    def registry(self) -> inflight.Registry:
        return inflight.Registry(os.path.join(self.root, "calls"))

    def test_nothing_starts_past_the_deadline(self) -> None:
        registry = self.registry()
        call = registry.register(KEY, "invoke", 1, 0.01)
        registry.clock = lambda: float(call.record["deadline"]) + 1  # type: ignore[method-assign]
        late = "the call's time ran out before git rev-parse; nothing was pushed"
        with inflight.calling(registry, call), self.assertRaisesRegex(NotApplied, late):
            self.adapter().invoke(KEY, PAYLOAD, 1)
        self.assertEqual((releases(self.work), tags(self.remote)), ([], []))

    def test_each_command_is_the_call_s_process_and_between_them_the_call_is_its_caller_s(self) -> None:
        registry = self.registry()
        call = registry.register(KEY, "invoke", 1, 30.0)
        seen: List[Any] = []
        adapter = self.adapter()
        real = adapter.runner

        def watched(argv: List[str], **options: Any) -> Outcome:
            seen.append((argv[1], call.record["child"]))
            done = real(argv, **options)
            seen.append((argv[1] + " ran", call.record["child"] is not None))
            return done

        adapter.runner = watched
        with inflight.calling(registry, call):
            adapter.invoke(KEY, PAYLOAD, 1)
        ran = [(what, child) for what, child in seen if what.endswith(" ran")]
        self.assertTrue(ran and all(child for _, child in ran), "each command was registered as the call's process")
        self.assertTrue(all(child is None for what, child in seen if not what.endswith(" ran")),
                        "before each command the call names no process: it is its caller's")
        self.assertEqual([what for what, _ in seen if not what.endswith(" ran")][-1], "push")
        [(_, view)] = registry.calls(KEY)
        self.assertEqual((view.command, view.alive), (False, True), "after the push the call is this process's again")


class RecordsTest(Repositories):
    """Items that are records: a CSV row names the repository and the release, and fills every git template."""

    def test_a_record_names_the_repository_the_tag_and_the_message(self) -> None:
        web = make_remote(self.root, "web")
        make_clone(self.root, "web", web)
        with open(os.path.join(self.root, "releases.csv"), "w", encoding="utf-8") as handle:
            handle.write("name,folder,version\napi,repos/api,2.3.0\nweb,repos/web,2.4.0\n")
        contract = release_contract(section(repository="{field.folder}",
                                            message="Release {field.name} {payload.version}",
                                            author={"name": "Release Bot", "email": "bot@example.invalid"}))
        contract["steps"][0].update(items={"csv": "releases.csv"}, key="{field.name}:v{field.version}",
                                    payload={"template": {"version": "{field.version}"}})
        cli = RunnerCli(self, root=self.root, env=dict(ISOLATED))
        cli.init(contract)
        cli("drive", "--owner", "agent", code=10)
        for remote, name, version in ((self.remote, "api", "2.3.0"), (web, "web", "2.4.0")):
            self.assertEqual(tags(remote), [f"refs/tags/v{version}"])
            self.assertEqual(git(remote, "log", "-1", "--format=%B", "main").strip(),
                             f"Release {name} {version}\n\nRunner-Key: {name}:v{version}")
        by_folders = release_contract(section(repository="{field.folder}"))
        found = [p.message for p in parse_contract_text(contract_markdown(json.dumps(by_folders)))[1]]
        self.assertTrue(any("{field.folder} is filled from an item's record" in p for p in found), found)


@unittest.skipUnless(HAS_GIT, "git is not installed")
class DriveTest(unittest.TestCase):
    """A real drive over twelve repositories, SIGKILLed twice while pushes are on their way, resumed in other
    processes."""

    NAMES = [f"r{n:02d}" for n in range(12)]

    def test_twelve_repositories_killed_mid_push_twice_end_with_one_release_each(self) -> None:
        cli = RunnerCli(self, env=dict(ISOLATED))
        remotes, works = {}, {}
        for n, name in enumerate(self.NAMES):
            # Every push is slow; three repositories' servers say "try again later" twice first.
            remotes[name] = make_remote(cli.root, name)
            works[name] = make_clone(cli.root, name, remotes[name])
            install_hooks(remotes[name], hook(refuse=2 if n % 4 == 1 else 0, sleep=0.4))
        cli.init(release_contract(section(author={"name": "Release Bot", "email": "bot@example.invalid"}),
                                  timeout_seconds=30, concurrency=4, max_rate_limited=5))

        def pushes(event: str) -> int:
            return sum(lines(os.path.join(remotes[n], "pushes.log")).count(event) for n in self.NAMES)

        def epoch() -> int:
            return int(cli.json("lease", "show").get("epoch") or 0)

        for kill in range(2):
            before = epoch()
            drive = cli.spawn("drive", "--owner", "agent-1", env=dict(ISOLATED))
            wait_for("the drive to take the lease", lambda: epoch() > before)
            started = pushes("start")  # pushes from now on are this drive's: those a killed one left began long ago
            wait_for("a push of this drive on its way",
                     lambda: pushes("start") > started and pushes("start") > pushes("end"))
            drive.send_signal(signal.SIGKILL)
            drive.wait()
            self.assertGreater(pushes("start"), pushes("end"), f"kill {kill}: while a push was on its way")
        done = cli.child("drive", "--owner", "agent-1", "--json", code=10, env=dict(ISOLATED))
        self.assertEqual(json.loads(done.out)["reason"], "complete")
        for n, name in enumerate(self.NAMES):
            with self.subTest(repository=name):
                self.assertEqual(lines(os.path.join(remotes[name], "refusals")), ["2"] if n % 4 == 1 else [],
                                 "a server that said 'try again later' was asked again until it accepted")
                [commit] = releases(remotes[name])
                self.assertEqual(tags(remotes[name]), ["refs/tags/v2.3.0"])
                self.assertEqual(git(remotes[name], "rev-parse", "v2.3.0^{commit}").strip(), commit)
                self.assertEqual(lines(os.path.join(remotes[name], "landed.log")), ["landed"], "one push landed")
                self.assertEqual(releases(works[name]), [commit], "one release commit was ever made")
                self.assertIn(f"Runner-Key: {name}:v2.3.0", git(remotes[name], "log", "-1", "--format=%B", commit))
        self.assertEqual(cli.status()["status"], "complete")
        effects = cli.json("effect", "list")["effects"]
        self.assertEqual(sorted(effects), sorted(f"{name}:v2.3.0" for name in self.NAMES))
        self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
        report = cli.json("report")
        self.assertGreaterEqual(report["recoveries"], 2)
        self.assertGreaterEqual(report["reconciled_effects"], 1, "a push a killed drive left was found, not made again")


class RecipeTest(unittest.TestCase):
    """``templates/recipes/git-release.md``: its contract passes ``contract check``, its commands parse, and its "to try
    it" block runs as written; with hooks that refuse and a drive killed mid-push, the one command finishes it."""

    def block(self) -> str:
        with open(RECIPE, encoding="utf-8") as handle:
            return re.search(r"To try it.*?```sh\n(.*?)```", handle.read(), re.S).group(1)  # type: ignore[union-attr]

    def project(self) -> str:
        scratch = scratch_dir("runner-recipe-")
        self.addCleanup(scratch.cleanup)
        with open(RECIPE, encoding="utf-8") as handle, \
                open(os.path.join(scratch.name, "contract.md"), "w", encoding="utf-8") as out:
            out.write(handle.read())
        return scratch.name

    def run_block(self, root: str, text: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        env = dict(child_env(pythonpath=False), RUNNER=REPO_ROOT, **ISOLATED)
        return subprocess.run(["sh", "-ec", text], cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=120)

    def test_the_recipe_passes_contract_check_and_its_commands_parse(self) -> None:
        block, problems = check_contract(RECIPE)
        self.assertEqual(problems, [])
        made = specs.read_contract(block)
        self.assertEqual((made.effects.git.tag, made.steps[0].items),  # type: ignore[union-attr]
                         ("v{payload.version}", specs.ItemsSpec(glob="repos/*/")))
        with open(RECIPE, encoding="utf-8") as handle:
            text = handle.read()
        parser = build_parser((add_proof_verbs,))
        shown = shown_commands(text)
        self.assertGreaterEqual(len(shown), 5)
        for command in shown:
            with self.subTest(command=command):
                parser.parse_args(split_command(shlex.split(command))[0])

    @unittest.skipUnless(HAS_GIT, "git is not installed")
    def test_the_block_runs_as_written(self) -> None:
        root = self.project()
        done = self.run_block(root, self.block())
        output = done.stdout.decode("utf-8", "replace")
        self.assertEqual(done.returncode, 10, output)
        for name in ("api", "web", "cli"):
            self.assertEqual(len(releases(os.path.join(root, "remotes", name + ".git"))), 1)

    @unittest.skipUnless(HAS_GIT, "git is not installed")
    def test_killed_mid_push_with_servers_that_say_not_now_the_one_command_finishes_it(self) -> None:
        root = self.project()
        setup = self.block().partition("python3 $RUNNER/runner init")[0]  # the repositories and their remotes
        done = self.run_block(root, setup)
        self.assertEqual(done.returncode, 0, done.stdout)
        for n, name in enumerate(("api", "web", "cli")):
            install_hooks(os.path.join(root, "remotes", name + ".git"), hook(refuse=n, sleep=0.5))
        cli = RunnerCli(self, root=root, env=dict(ISOLATED))
        cli("init", "--contract", os.path.join(root, "contract.md"))
        drive = cli.spawn("drive", "--owner", "agent-1", env=dict(ISOLATED))
        logs = [os.path.join(root, "remotes", n + ".git", "pushes.log") for n in ("api", "web", "cli")]
        wait_for("a push on its way", lambda: any(lines(log).count("start") > lines(log).count("end") for log in logs))
        drive.send_signal(signal.SIGKILL)
        drive.wait()
        cli.child("drive", "--owner", "agent-1", code=10, env=dict(ISOLATED))
        for n, name in enumerate(("api", "web", "cli")):
            remote = os.path.join(root, "remotes", name + ".git")
            self.assertEqual((len(releases(remote)), tags(remote)), (1, ["refs/tags/v2.3.0"]))
            self.assertEqual(lines(os.path.join(remote, "landed.log")), ["landed"])
            self.assertEqual(lines(os.path.join(remote, "refusals")), [str(n)] if n else [], "'not now', then accepted")


if __name__ == "__main__":
    unittest.main()
