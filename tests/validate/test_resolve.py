"""bot/validate/resolve.py: a candidate REF or patch file -> the Revision to validate; its trailers."""
from __future__ import annotations

import re

import git
import pytest

from tests.repos import init_repo
from bot.errors import OptbotError

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture
def engine(tmp_path):
    """A scratch engine repository: a base commit, then a two-commit stack on branch `stack`."""
    from bot.engine import EngineCheckout

    d = tmp_path / "engine"
    repo = init_repo(d, {"src/m.py": "def f(x):\n    return x * 2\n"})
    base = repo.head.commit.hexsha
    repo.git.checkout("-qb", "stack")
    for i, trailers in enumerate(["Optbot-Kind: merge-siblings\nOptbot-Adds-Kernels: a, b",
                                  "Optbot-Adds-Kernels: b, c\nOptbot-Removes-Kernels: none"]):
        (d / "src" / f"k{i}.py").write_text(f"K = {i}\n")
        repo.git.add("-A")
        repo.git.commit("-qm", f"commit {i}\n\nbody\n\n{trailers}", env=ENV)
    repo.git.checkout("-q", "main")
    return EngineCheckout("scratch", d, base, "main", "src")


def test_a_stack_resolves_to_its_commits_and_the_union_of_their_trailers(engine):
    from bot.validate.resolve import resolve_candidate

    rev = resolve_candidate(engine, "stack", engine.base_sha)
    assert rev.sha == engine.repo.commit("stack").hexsha and rev.base_sha == engine.base_sha
    assert [subject for _, subject in rev.commits] == ["commit 0", "commit 1"]  # oldest first
    assert {k: sorted(v) for k, v in rev.trailers.items()} == {
        "Optbot-Kind": ["merge-siblings"], "Optbot-Adds-Kernels": ["a", "b", "c"], "Optbot-Removes-Kernels": []}
    assert git.Repo(rev.worktree).head.commit.hexsha == rev.sha and (rev.worktree / "src" / "k1.py").is_file()


def test_a_patch_file_is_the_same_commit_every_time(engine, tmp_path):
    from bot.validate.resolve import resolve_candidate

    patch = tmp_path / "fix.patch"
    patch.write_text("Halve the work\n\nOptbot-Kind: hoist-constant\n\n" + engine.repo.git.diff(
        engine.base_sha, "stack~1", "--no-color") + "\n")
    first = resolve_candidate(engine, str(patch), engine.base_sha)
    again = resolve_candidate(engine, str(patch), engine.base_sha)
    assert first.sha == again.sha != engine.base_sha  # fixed author and date
    assert first.commits == [(first.sha, "Halve the work")] and first.trailers == {"Optbot-Kind": ["hoist-constant"]}


def test_what_cannot_be_validated_is_a_one_line_error(engine, tmp_path):
    from bot.validate.resolve import resolve_base, resolve_candidate

    with pytest.raises(OptbotError, match="neither a patch file nor a commit"):
        resolve_candidate(engine, "no-such-ref", engine.base_sha)
    with pytest.raises(OptbotError, match="is the base commit"):
        resolve_candidate(engine, "main", engine.base_sha)
    with pytest.raises(OptbotError, match="is not on top of the base"):
        resolve_candidate(engine, "main", engine.repo.commit("stack").hexsha)
    with pytest.raises(OptbotError, match="--base 'nope'"):
        resolve_base(engine, "nope")
    bad = tmp_path / "bad.patch"
    bad.write_text("msg\n\ndiff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(OptbotError, match="does not apply onto base"):
        resolve_candidate(engine, str(bad), engine.base_sha)
    for ref in ("HEAD@{1000}", "HEAD~999", "main^{tree}x"):  # gitpython: IndexError, BadName, ...
        with pytest.raises(OptbotError, match=f"--candidate '{re.escape(ref)}': neither a patch file nor a commit"):
            resolve_candidate(engine, ref, engine.base_sha)
    binary = tmp_path / "binary.patch"
    binary.write_bytes(b"\xff\xfe\x00diff --git a/x b/x\n")
    with pytest.raises(OptbotError, match=r"binary\.patch: not a text patch \(byte 0 is not UTF-8\)"):
        resolve_candidate(engine, str(binary), engine.base_sha)


def test_cli_errors_are_one_line_exit_2(capsys, diffusers_engine, tmp_path):
    from bot.cli import main

    def optbot(*args):
        with pytest.raises(SystemExit) as e:
            main(list(args))
        return e.value.code, capsys.readouterr()

    def one_error(cap) -> str:
        assert "Traceback" not in cap.err
        (line,) = [ln for ln in cap.err.splitlines() if ln.startswith("error:")]
        return line

    code, cap = optbot("validate", "flux2", "--preset", "tiny", "--device", "cpu", "--candidate", "no-such-ref")
    assert code == 2 and "neither a patch file nor a commit" in one_error(cap)
    bad = tmp_path / "bad.patch"
    bad.write_text("msg\n\ndiff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    code, cap = optbot("validate", "flux2", "--preset", "tiny", "--device", "cpu", "--candidate", str(bad))
    assert code == 2 and "does not apply" in one_error(cap)
    code, cap = optbot("validate", "--help")
    assert code == 0 and "Examples" in cap.out and "held" in cap.out


def test_trailers_parsed_and_merged():
    from bot.validate.resolve import parse_trailers

    msg = "Subject\n\nbody\n\nOptbot-Kind: merge-siblings\nOptbot-Adds-Kernels: a, b\nOptbot-Adds-Kernels: b, c\n"
    assert parse_trailers(msg) == {"Optbot-Kind": ["merge-siblings"], "Optbot-Adds-Kernels": ["a", "b", "c"]}


def test_one_trailer_parser_for_validator_and_generators():
    """The validator (lists, bot/validate/resolve.py) and bot/generate/candidate (text) read the same
    trailers: the last paragraph only, "none" = no values, folded lines joined."""
    from bot.generate.candidate import commit_message, make_trailers
    from bot.trailers import parse_trailers as text, trailer_values
    from bot.validate.resolve import parse_trailers as lists

    msg = commit_message("t", "prose\nOptbot-Kind: not-a-trailer", make_trailers("", "absorb-bias", ["k1", "k2"], []))
    msg += "Optbot-Generator: variant-search,\n  extra\n"
    assert text(msg)["Optbot-Kind"] == "absorb-bias" and text(msg)["Optbot-Removes-Kernels"] == "none"
    assert lists(msg)["Optbot-Kind"] == ["absorb-bias"] and lists(msg)["Optbot-Removes-Kernels"] == []
    assert lists(msg)["Optbot-Generator"] == ["variant-search", "extra"]
    assert {k: trailer_values(v) for k, v in text(msg).items()} == lists(msg)


def test_bench_names_each_candidate_row_apart(tmp_path):
    """Two store patches are both patch.diff: each row is named by its entry's folder (2026-12-06, an
    H100 bench gave two rows "candidate:patch" and only their commit told them apart); a ref is its
    own name, one candidate is "candidate", and a name met twice is numbered."""
    from bot.validate.resolve import candidate_labels

    a, b = tmp_path / "entry-a" / "patch.diff", tmp_path / "entry-b" / "patch.diff"
    other = tmp_path / "stack7.patch"
    for p in (a, b, other):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    assert candidate_labels([str(a)]) == ["candidate"]
    assert candidate_labels([str(a), str(b), str(other), "optbot/flux2/abc"]) == [
        "candidate:entry-a", "candidate:entry-b", "candidate:stack7", "candidate:optbot/flux2/abc"]
    assert candidate_labels([str(a), str(a)]) == ["candidate:entry-a", "candidate:entry-a#2"]
