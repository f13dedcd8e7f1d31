"""Path confinement of the agent's file tools: ../, absolute paths, symlinks (in and out), .git."""
from __future__ import annotations

import os

import pytest

from bot.generate.agent.tools import ToolError, ToolHooks, Workspace, confine


def _ws(root):
    nope = lambda *a: "unused"  # noqa: E731
    return Workspace(root, ToolHooks(nope, nope, nope, nope, nope, nope))


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
    assert err and "unknown arguments ['nope']" in out
    out, err = ws.call("write_file", {"path": "src/c.py"})
    assert err and "missing required arguments ['content']" in out


# ------------------------------------------------------------------------------------------------
# the search tool as an attacker calls it (issue 14): every answer stays inside the worktree


@pytest.mark.parametrize("glob", ["../../../../../../../../outside/secret.txt", "../" * 12 + "proc/self/environ",
                                  "/etc/passwd", "link_out/*", "*/../../outside/*"])
def test_search_glob_cannot_leave_the_worktree(tree, glob):
    root, outside = tree
    out, err = _ws(root).call("search", {"pattern": ".", "glob": glob})
    assert err and "glob" in out, out
    assert "top secret" not in out and "PATH=" not in out  # the file's content, the environment


def test_search_does_not_read_through_symlinked_folders(tree):
    root, outside = tree
    (outside / "leak.py").write_text("token = 'sekrit'\n")
    out, err = _ws(root).call("search", {"pattern": "sekrit|top secret"})
    assert not err and out == "no matches", out  # link_out/leak.py and src/secret_link.py are symlinks
    out, err = _ws(root).call("search", {"pattern": "x = 1", "glob": "*.py"})
    assert out == "src/a.py:1: x = 1", out  # link_in/ points inside, but is a symlink: not followed


def test_search_with_a_catastrophic_regex_stops_at_its_time_limit(tree, monkeypatch):
    import time

    import bot.generate.agent.tools as tools

    root, _ = tree
    (root / "src" / "b.py").write_text("a" * 40 + "!\n")
    monkeypatch.setattr(tools, "SEARCH_TIMEOUT_S", 2.0)
    t0 = time.monotonic()
    out, err = _ws(root).call("search", {"pattern": "(a+)+$"})
    assert err and "time limit" in out, out
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("name, args, says", [
    ("read_file", {"path": "src/a.py", "start_line": "abc"}, "start_line"),
    ("read_file", {"path": "src"}, "no such file"),
    ("write_file", {"path": "src/c.py", "content": ["x = 1"]}, "content"),
    ("write_file", {"path": "src", "content": "x"}, "folder"),
    ("edit_file", {"path": "src/bin.py", "old_text": "a", "new_text": "b"}, "not a text file"),
    ("search", {"pattern": 7}, "pattern"),
    ("read_profile", {"top": True}, "top"),
])
def test_every_tool_error_comes_back_as_a_tool_result(tree, name, args, says):
    root, _ = tree
    (root / "src" / "bin.py").write_bytes(b"\xff\xfe\x00a\x80")
    out, err = _ws(root).call(name, args)  # never raises
    assert err and says in out, out


# ------------------------------------------------------------------------------------------------
# declare_kernels / run_kernel_test: schema checks, confinement, the declaration the validator gets


@pytest.mark.parametrize("args, says", [
    ({"adds": "k"}, "must be an array"),
    ({"adds": [3]}, "list of strings"),
    ({"adds": ["a,b"], "tests": ["src/test_k.py"]}, "no comma"),
    ({"adds": ["k"]}, "needs its kernel test"),
    ({"adds": ["k"], "tests": ["../outside/test_x.py"]}, "'..' is not allowed"),
    ({"adds": ["k"], "tests": ["link_out/test_x.py"]}, "symlink"),
    ({"adds": ["k"], "tests": [".git/test_x.py"]}, ".git"),
    ({"adds": ["k"], "tests": ["src/a.py"]}, "test_<op>.py"),
    ({"adds": ["k"], "tests": ["src/test_missing.py"]}, "no such file"),
    ({"kernels": ["k"]}, "unknown arguments"),
])
def test_declare_kernels_checks_its_arguments(tree, args, says):
    root, _ = tree
    ws = _ws(root)
    out, err = ws.call("declare_kernels", args)
    assert err and says in out, out
    assert ws.declared.tests == () and ws.declared.adds == ()


def test_declared_kernels_and_tests_go_to_the_hooks(tree):
    root, _ = tree
    (root / "src" / "test_k.py").write_text("SHAPES = []\n")
    seen = []
    ws = Workspace(root, ToolHooks(seen.append, seen.append, None, None, None, seen.append))
    out, err = ws.call("run_kernel_test", {})
    assert err and "no kernel test is declared" in out
    out, err = ws.call("declare_kernels", {"adds": ["_k_kernel", "_k_kernel"], "removes": ["aten::silu@*gate_fn"],
                                            "tests": [str(root / "src" / "test_k.py")]})
    assert not err and "src/test_k.py" in out, out
    assert ws.declared.adds == ("_k_kernel",) and ws.declared.tests == ("src/test_k.py",)
    assert ws.call("run_kernel_test", {"path": "src/a.py"})[1]  # not a declared test
    assert ws.call("run_kernel_test", {"path": "../outside/secret.txt"})[1]
    ws.call("run_kernel_test", {"path": "./src/test_k.py"})
    ws.call("run_correctness", {})
    assert seen == [["src/test_k.py"], ws.declared]
