"""`optbot store sync-sources` (bot/knowledge/store.replace_added_file): an entry's edited kernel source
goes back into its patch.diff as git itself would write it, and nothing else in the patch moves."""
from __future__ import annotations

import shutil
import subprocess

import git
import pytest

from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import added_file_content, replace_added_file
from tests.test_cli_profile import optbot


def _new_file_diff(repo, path: str, content: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(content)
    subprocess.run(["git", "add", "-N", path], cwd=repo, check=True)
    out = subprocess.run(["git", "diff", "--", "a.py", path], cwd=repo, check=True, capture_output=True, text=True).stdout
    subprocess.run(["git", "rm", "-q", "--cached", path], cwd=repo, check=True)
    return out


@pytest.mark.parametrize("after", ["x = 1\ny = 2\nz = 3\n", "x = 1\n", "x = 1\ny = 3"])
def test_the_rewritten_patch_is_what_git_writes(tmp_path, after):
    repo = git.Repo.init(tmp_path)
    (tmp_path / "a.py").write_text("a = 1\n")
    repo.index.add(["a.py"])
    repo.index.commit("base")
    (tmp_path / "a.py").write_text("a = 2\n")  # an edit to an engine file beside the new kernel file
    before = _new_file_diff(tmp_path, "k/kernel.py", "x = 1\ny = 2\n")
    want = _new_file_diff(tmp_path, "k/kernel.py", after)
    got = replace_added_file(before, "k/kernel.py", after)
    assert got == want
    assert added_file_content(got, "k/kernel.py") == after
    with pytest.raises(ValueError, match="creates no file k/other.py"):
        replace_added_file(before, "k/other.py", after)


def test_sync_sources_rewrites_only_what_changed(tmp_path):
    store = tmp_path / "kernel_store"
    shutil.copytree(SHIPPED_STORE / "qwen-image-fp8-norm-quant", store / "qwen-image-fp8-norm-quant")
    entry = store / "qwen-image-fp8-norm-quant"
    before = (entry / "patch.diff").read_text()
    r = optbot("store", "sync-sources", "--store", str(store), "qwen-image-fp8-norm-quant")
    assert r.returncode == 0, r.stderr
    assert "already holds every kernel source" in r.stdout and (entry / "patch.diff").read_text() == before
    src = entry / "norm_quant.py"
    src.write_text(src.read_text() + "# edited\n")
    r = optbot("store", "sync-sources", "--store", str(store), "qwen-image-fp8-norm-quant")
    assert r.returncode == 0 and "rewrote norm_quant.py in patch.diff" in r.stdout, r.stdout + r.stderr
    after = (entry / "patch.diff").read_text()
    assert added_file_content(after, "src/diffusers/models/optbot_kernels/norm_quant.py") == src.read_text()
    # every other file of the patch byte for byte
    def rest(patch):
        return [ln for ln in patch.splitlines() if ln != "+# edited" and not ln.startswith(("index 0000000..", "@@ -0,0"))]

    assert rest(after) == rest(before)
    assert len(after.splitlines()) == len(before.splitlines()) + 1
    r = optbot("store", "check", "--store", str(store), "--no-kernels", "qwen-image-fp8-norm-quant")
    assert "sources" in r.stdout and "differs" not in r.stdout, r.stdout


def test_an_unknown_entry_is_a_clean_error(tmp_path):
    r = optbot("store", "sync-sources", "no-such-entry")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no-such-entry" in r.stderr
