"""The SGLang engine repository: built from a wheel as one deterministic commit; `optbot engine`."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import git
import pytest

from bot import engine as eng
from bot.errors import EngineError

ROOT = Path(__file__).resolve().parents[2]


def _fake_wheel(path: Path, tag: str, files: dict[str, bytes], order=None) -> Path:
    """A wheel-shaped zip: package files, a compiled extension for `tag`, and its .dist-info."""
    whl = path / f"fakepkg-1.0-{tag}-{tag}-manylinux_2_34_x86_64.whl"
    entries = dict(files)
    entries[f"fakepkg/_ext.{tag}-x86_64-linux-gnu.so"] = os.urandom(64)  # differs per wheel
    entries["fakepkg-1.0.dist-info/RECORD"] = f"built for {tag}".encode()
    names = order or sorted(entries)
    with zipfile.ZipFile(whl, "w") as zf:
        for n in names:
            info = zipfile.ZipInfo(n)
            info.external_attr = (0o755 if n.endswith(".sh") else 0o644) << 16
            zf.writestr(info, entries[n])
    return whl


FILES = {"fakepkg/__init__.py": b"X = 1\n", "fakepkg/sub/mod.py": b"def f():\n    return 2\n",
         "fakepkg/kern/k.cuh": b"// jit source\n", "fakepkg/tools/run.sh": b"#!/bin/sh\necho hi\n"}


def _materialize_in(home: Path, wheel: Path, monkeypatch) -> eng.EngineCheckout:
    (home / "downloads").mkdir(parents=True)
    shutil.copy(wheel, home / "downloads" / wheel.name)
    monkeypatch.setenv("OPTBOT_HOME", str(home))
    return eng.checkout_engine("pypi-wheel:fakepkg==1.0", None, "python", "fakepkg")


def test_wheel_repo_is_the_same_commit_from_any_wheel_of_the_release(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    w311 = _fake_wheel(tmp_path / "a", "cp311", FILES)
    rev = sorted(set(FILES) | {"fakepkg/_ext.cp312-x86_64-linux-gnu.so", "fakepkg-1.0.dist-info/RECORD"}, reverse=True)
    (tmp_path / "b").mkdir()
    w312 = _fake_wheel(tmp_path / "b", "cp312", FILES, order=rev)  # other tag, other file order
    a = _materialize_in(tmp_path / "h1", w311, monkeypatch)
    b = _materialize_in(tmp_path / "h2", w312, monkeypatch)
    assert a.base_sha == b.base_sha
    repo = a.repo
    tracked = repo.git.ls_files().splitlines()
    assert sorted(tracked) == sorted(f"python/{n}" for n in FILES)  # no .so, no .dist-info
    c = repo.head.commit
    assert c.message.strip() == "upstream fakepkg 1.0" and c.author.name == "optbot"
    assert c.authored_datetime.year == 2000 and c.committed_datetime.year == 2000
    assert repo.git.ls_files("-s", "python/fakepkg/tools/run.sh").startswith("100755")
    assert repo.git.ls_files("-s", "python/fakepkg/sub/mod.py").startswith("100644")


def test_wheel_repo_sha_follows_the_content(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _materialize_in(tmp_path / "h1", _fake_wheel(tmp_path / "a", "cp311", FILES), monkeypatch)
    changed = dict(FILES, **{"fakepkg/sub/mod.py": b"def f():\n    return 3\n"})
    b = _materialize_in(tmp_path / "h2", _fake_wheel(tmp_path / "b", "cp311", changed), monkeypatch)
    assert a.base_sha != b.base_sha


def test_missing_wheel_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBOT_HOME", str(tmp_path / "home"))
    with pytest.raises(EngineError, match=r"could not get a wheel of sglang==0\.0\.0\.1.*downloads"):
        eng.checkout_engine("pypi-wheel:sglang==0.0.0.1", None, "python")


def test_sglang_repo_is_one_upstream_commit_in_fork_layout(sglang_engine):
    repo = sglang_engine.repo
    roots = repo.git.rev_list("--max-parents=0", "HEAD").split()
    assert len(roots) == 1 and repo.commit(roots[0]).message.strip() == "upstream sglang 0.5.23"
    p = sglang_engine.repo_path / "python" / "sglang" / "multimodal_gen" / "runtime" / "models" / "dits"
    assert (p / "flux_2.py").is_file() and (p / "qwen_image.py").is_file()
    assert repo.git.ls_files("*.so") == ""  # compiled parts are never in the repository
    assert not any(sglang_engine.repo_path.glob("python/*.dist-info"))


@pytest.mark.slow
def test_sglang_same_sha_on_a_fresh_home(sglang_engine, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "downloads").mkdir(parents=True)
    for f in (eng.optbot_home() / "downloads").glob("sglang-0.5.23-*.whl"):
        shutil.copy(f, home / "downloads" / f.name)
    monkeypatch.setenv("OPTBOT_HOME", str(home))
    other = eng.checkout_engine("pypi-wheel:sglang==0.5.23", None, "python")
    assert other.repo_path != sglang_engine.repo_path and other.base_sha == sglang_engine.base_sha


def optbot(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


def test_engine_init_prints_where_and_sha(sglang_engine, diffusers_engine):
    for name, co in (("sglang", sglang_engine), ("diffusers", diffusers_engine)):
        r = optbot("engine", "init", name)
        assert r.returncode == 0, r.stderr
        assert str(co.repo_path) in r.stdout and co.base_sha in r.stdout
    r = optbot("engine", "list")
    assert r.returncode == 0 and "pypi-wheel:sglang==0.5.23" in r.stdout and "qwen-image" in r.stdout


def _fork(tmp_path):
    repo = git.Repo.init(tmp_path / "fork", initial_branch="main")
    (tmp_path / "fork" / "python").mkdir()
    (tmp_path / "fork" / "python" / "m.py").write_text("X = 1\n")
    repo.index.add(["python/m.py"])
    sha = repo.index.commit("one", author=eng.BOT_ACTOR, committer=eng.BOT_ACTOR).hexsha
    repo.create_head("my-branch")
    return repo, sha


def test_engine_init_fork_path_with_ref(tmp_path):
    _, sha = _fork(tmp_path)
    r = optbot("engine", "init", f"sglang={tmp_path / 'fork'}", "--ref", "my-branch")
    assert r.returncode == 0, r.stderr
    assert sha in r.stdout and str(tmp_path / "fork" / "python") in r.stdout  # sglang's import root
    r = optbot("engine", "init", str(tmp_path / "fork"), "--ref", "main", "--import-root", "python")
    assert r.returncode == 0 and sha in r.stdout


def test_a_fork_of_sglang_runs_with_sglang_s_model_class_and_adapter(tmp_path):
    from bot.target import resolve_target

    _, sha = _fork(tmp_path)
    t = resolve_target("flux2", f"sglang={tmp_path / 'fork'}", "my-branch", "tiny", "cpu")
    assert t.engine_name == "sglang" and t.checkout.base_sha == sha and t.checkout.import_root == "python"
    assert t.model_class.startswith("sglang.multimodal_gen.") and t.workload.engines["sglang"].adapter == "sglang"


def test_engine_init_errors_are_one_clear_line():
    r = optbot("engine", "init", "vllm")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unknown engine 'vllm'" in r.stderr and "sglang" in r.stderr
    r = optbot("engine", "init", "./no/such/dir")
    assert r.returncode == 2 and "no such path" in r.stderr and "Traceback" not in r.stderr
