"""Path confinement of the agent's file tools: ../, absolute paths, symlinks (in and out), .git."""
from __future__ import annotations

import os

import pytest

from bot.generate.agent.tools import ToolError, ToolHooks, Workspace, confine


def _ws(root):
    nope = lambda *a: "unused"  # noqa: E731
    return Workspace(root, ToolHooks(nope, nope, nope, nope, nope))


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "wt"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("x = 1\ny = 2\n")
    (root / ".git").write_text("gitdir: /elsewhere\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    os.symlink(outside, root / "link_out")
    os.symlink(outside / "secret.txt", root / "src" / "secret_link.py")
    os.symlink(root / "src", root / "link_in")
    return root, outside


@pytest.mark.parametrize("rel", ["../outside/secret.txt", "src/../../outside/secret.txt", "link_out/secret.txt",
                                 "src/secret_link.py", "link_in/a.py", ".git", ".git/hooks/pre-commit", ""])
def test_confine_rejects_escapes(tree, rel):
    root, _ = tree
    with pytest.raises(ToolError):
        confine(root, rel)


def test_confine_absolute_paths(tree):
    root, outside = tree
    assert confine(root, str(root / "src" / "a.py")) == (root / "src" / "a.py").resolve()
    with pytest.raises(ToolError, match="outside the worktree"):
        confine(root, str(outside / "secret.txt"))
    with pytest.raises(ToolError):
        confine(root, "/etc/passwd")


def test_tools_read_edit_write_search(tree):
    root, outside = tree
    ws = _ws(root)
    out, err = ws.call("read_file", {"path": "src/a.py"})
    assert not err and "    1  x = 1" in out
    out, err = ws.call("edit_file", {"path": "src/a.py", "old_text": "y = 2", "new_text": "y = 3"})
    assert not err and (root / "src" / "a.py").read_text() == "x = 1\ny = 3\n"
    out, err = ws.call("edit_file", {"path": "src/a.py", "old_text": "nothere", "new_text": ""})
    assert err and "occurs 0 times" in out
    out, err = ws.call("write_file", {"path": "src/new/k.py", "content": "K = 1\n"})
    assert not err and (root / "src" / "new" / "k.py").read_text() == "K = 1\n"
    out, err = ws.call("search", {"pattern": r"^K ="})
    assert not err and "src/new/k.py:1: K = 1" in out
    # the symlinked file is never searched through, and the secret is never returned
    out, _ = ws.call("search", {"pattern": "secret"})
    assert "top secret" not in out


@pytest.mark.parametrize("args", [
    {"path": "../outside/evil.py", "content": "x"},
    {"path": "link_out/evil.py", "content": "x"},
    {"path": "src/secret_link.py", "content": "overwritten"},
    {"path": ".git/hooks/post-commit", "content": "#!/bin/sh\necho pwned\n"},
])
def test_writes_never_escape(tree, args):
    root, outside = tree
    ws = _ws(root)
    out, err = ws.call("write_file", args)
    assert err, out
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert not (outside / "evil.py").exists()
    assert not (root / ".git").is_dir()


def test_unknown_tool_and_bad_args(tree):
    root, _ = tree
    ws = _ws(root)
    assert ws.call("rm_rf", {})[1]
    out, err = ws.call("read_file", {"nope": 1})
    assert err and "bad arguments" in out
