"""`optbot store check --engine PATH --ref main --propose` (the nightly store check), through the
real CLI: a real knowledge repository with two seed entries, a real engine repository whose main
moved past the entries' base so that one patch no longer applies, the local forge, and the real
PyGithub client against the GitHub stand-in on 127.0.0.1."""
from __future__ import annotations

import json
import shutil

import git
import pytest
import yaml

from bot.cli import cli
from bot.knowledge.location import SHIPPED_STORE
from tests.repos import FIXED_DATE, init_repo

GONE = "flux2-swiglu"  # its patch rewrites Flux2SwiGLU.forward, which main changes below
KEPT = "qwen-image-cfg-modulation-cache"  # touches the Qwen-Image transformer only
FLUX2 = "src/diffusers/models/transformers/transformer_flux2.py"


@pytest.fixture
def nightly(tmp_path, diffusers_engine, monkeypatch):
    """knowledge repository (+ bare remote) holding the two entries; an engine clone whose main has
    one commit more than the entries' base, rewriting the line the swiglu patch changes."""
    files = {"lessons/README.md": "lessons\n"}
    for eid in (GONE, KEPT):
        for f in sorted((SHIPPED_STORE / eid).iterdir()):
            if f.is_file():
                files[f"kernel_store/{eid}/{f.name}"] = f.read_text()
    know = init_repo(tmp_path / "knowledge", files)
    bare = tmp_path / "knowledge.git"
    git.Repo.init(bare, bare=True, initial_branch="main")
    know.create_remote("origin", str(bare))
    know.git.push("origin", "main")

    engine = git.Repo.clone_from(str(diffusers_engine.repo_path), tmp_path / "engine", branch="main")
    with engine.config_writer() as cw:
        cw.set_value("user", "name", "engine dev")
        cw.set_value("user", "email", "dev@localhost")
    src = tmp_path / "engine" / FLUX2
    old = "        x = self.gate_fn(x[..., :half]) * x[..., half:]\n"
    assert old in src.read_text()
    src.write_text(src.read_text().replace(old, "        x = self.gate_fn(x[..., :half]).mul(x[..., half:])\n"))
    engine.git.commit("-qam", "Flux2SwiGLU: multiply in place of *",
                      env={"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE})
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path / "runs"))
    for var in ("OPTBOT_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "OPTBOT_KNOWLEDGE_REPO", "OPTBOT_ENGINE_REPO"):
        monkeypatch.delenv(var, raising=False)
    return {"knowledge": know, "bare": bare, "engine": engine, "tip": engine.head.commit.hexsha, "tmp": tmp_path}


def _check(cli_runner, n, *extra, code=0):
    out = n["tmp"] / "check.json"
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(n["knowledge"].working_tree_dir),
                                "--engine", str(n["engine"].working_tree_dir), "--ref", "main", "--no-kernels",
                                "--propose", "--json", str(out), *extra])
    assert r.exit_code == code, r.output
    return json.loads(out.read_text()), r


def _entry_yaml(repo: git.Repo, ref: str, eid: str) -> dict:
    return yaml.safe_load(repo.git.show(f"{ref}:kernel_store/{eid}/entry.yaml"))


def test_check_against_the_tip_without_a_proposal(cli_runner, nightly):
    """--engine PATH --ref main: the patches go onto main's tip, not the entries' base sha."""
    out = nightly["tmp"] / "plain.json"
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(nightly["knowledge"].working_tree_dir),
                                "--engine", str(nightly["engine"].working_tree_dir), "--ref", "main",
                                "--no-kernels", "--json", str(out)])
    assert r.exit_code == 1, r.output  # one patch fails
    by = {e["entry_id"]: {c["name"]: c for c in e["checks"]} for e in json.loads(out.read_text())["entries"]}
    assert by[GONE]["patch"]["ok"] is False and by[GONE]["patch"]["details"]["status"] == "conflict"
    assert nightly["tip"][:12] in by[GONE]["patch"]["reason"] and FLUX2 in by[GONE]["patch"]["reason"]
    assert by[KEPT]["patch"]["ok"] is True and by[KEPT]["patch"]["details"]["at"] == nightly["tip"]
    # and at the entries' own base (no --engine) both still apply
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(nightly["knowledge"].working_tree_dir),
                                "--no-kernels"])
    assert r.exit_code == 0, r.output


def test_local_forge_retires_the_entry_that_no_longer_applies(cli_runner, nightly):
    know = nightly["knowledge"]
    head_before = know.head.commit.hexsha
    data, r = _check(cli_runner, nightly)
    p = data["proposal"]
    assert p["branch"] == "optbot/store-check/diffusers" and p["pr"]["action"] == "local"
    by = {d["entry_id"]: d for d in p["decisions"]}
    assert by[GONE]["outcome"] == "no-longer-applies" and by[GONE]["done"] == "retired"
    assert by[KEPT]["outcome"] == "holds" and by[KEPT]["action"] == "none"
    # one commit on the branch, from HEAD; only the retired entry's entry.yaml changed
    assert p["files"] == [f"kernel_store/{GONE}/entry.yaml"]
    assert know.commit(p["branch"]).parents[0].hexsha == head_before
    retired = _entry_yaml(know, p["branch"], GONE)
    assert retired["status"] == "retired" and retired["retired"]["engine_sha"] == nightly["tip"]
    assert retired["retired"]["reason"].startswith(f"patch kernel_store/{GONE}/patch.diff does not apply at {nightly['tip'][:12]}; "
                                                   f"conflicts in {FLUX2}")
    assert _entry_yaml(know, p["branch"], KEPT) == _entry_yaml(know, "main", KEPT)  # left alone
    # the working tree and HEAD of the knowledge checkout are untouched
    assert know.head.commit.hexsha == head_before and not know.is_dirty(untracked_files=True)
    # the PR text: one row per entry, the device that measured, the action and why
    text = (nightly["tmp"] / "runs").glob("*store-check*/forge/knowledge-pr.md")
    body = next(text).read_text()
    assert f"| `{GONE}` |" in body and f"| `{KEPT}` |" in body and "| retired |" in body
    assert "Measured on: **cpu**." in body and "no entry is called slower from CPU timings" in body
    assert nightly["tip"] in body
    # and the local dashboard holds the night's section
    board = (nightly["tmp"] / "runs" / "dashboard.md").read_text()
    assert "<!-- optbot-dashboard-section: store-check -->" in board and f"| {GONE} | no-longer-applies | retired |" in board


def test_a_retired_entry_is_skipped_by_the_next_check_and_by_replay(cli_runner, nightly, diffusers_engine, tmp_path):
    from bot.generate.replay import replay
    from tests.fakes import opportunity

    data, _ = _check(cli_runner, nightly)
    know = nightly["knowledge"]
    know.git.checkout(data["proposal"]["branch"])  # as if a person merged the proposal
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(know.working_tree_dir), "--no-kernels"])
    assert r.exit_code == 0, r.output
    assert f"{GONE}: retired (patch " in r.stderr and f"ok   {GONE}" not in r.stdout
    opp = opportunity("fuse-elementwise-chain", id="o1")
    res = replay(diffusers_engine, [opp], "diffusers", "h200", "flux2",
                 store_root=know.working_tree_dir + "/kernel_store")
    assert [(x.entry_id, x.status) for x in res] == [(GONE, "retired")]
    assert res[0].candidate is None and "does not apply" in res[0].reason and nightly["tip"][:12] in res[0].reason


@pytest.fixture
def gh(nightly, standin, monkeypatch):
    standin.add_repo("team/optbot", nightly["bare"])
    monkeypatch.setenv("OPTBOT_GITHUB_TOKEN", "test-token")
    monkeypatch.setenv("OPTBOT_GITHUB_API_URL", standin.base)
    monkeypatch.setenv("OPTBOT_GITHUB_WRITE_DELAY", "0")
    monkeypatch.setenv("OPTBOT_GITHUB_MAX_WAIT", "3")
    return standin


def test_two_nights_one_pull_request_and_a_closed_one_stays_closed(cli_runner, nightly, gh):
    args = ("--knowledge-repo", "team/optbot")
    first, _ = _check(cli_runner, nightly, *args)
    assert first["proposal"]["pr"]["action"] == "opened"
    pulls = gh.pulls("team/optbot")
    assert len(pulls) == 1 and pulls[0]["head"]["ref"] == "optbot/store-check/diffusers"
    assert f"| `{GONE}` |" in pulls[0]["body"] and "no-longer-applies" in pulls[0]["body"]
    pushed = git.Repo(nightly["bare"]).commit("optbot/store-check/diffusers")
    assert yaml.safe_load(pushed.tree[f"kernel_store/{GONE}/entry.yaml"].data_stream.read())["status"] == "retired"

    second, _ = _check(cli_runner, nightly, *args)
    assert second["proposal"]["pr"]["action"] == "updated"
    assert second["proposal"]["pr"]["number"] == first["proposal"]["pr"]["number"]
    assert len(gh.pulls("team/optbot")) == 1  # never a second one

    gh.close_pr("team/optbot", first["proposal"]["pr"]["number"])
    third, _ = _check(cli_runner, nightly, *args)
    assert third["proposal"]["pr"]["action"] == "closed-by-person"
    pulls = gh.pulls("team/optbot")
    assert len(pulls) == 1 and pulls[0]["state"] == "closed"  # not reopened
    assert not [m for m, p in gh.requests if m == "POST" and p.endswith("/pulls")][1:]  # one create, ever


def test_each_night_rewrites_the_store_check_section_of_the_one_dashboard(cli_runner, nightly, gh):
    """The nightly check keeps its own section of the engine repository's dashboard: every entry's
    outcome and the proposal; two nights leave one issue, and a re-validate box a maintainer ticked
    there is unticked by the night that re-validated the entry."""
    gh.add_repo("team/engine", None)
    args = ("--knowledge-repo", "team/optbot", "--repo", "team/engine")
    first, r = _check(cli_runner, nightly, *args)
    assert "dashboard: opened" in r.stdout, r.output
    (issue,) = gh.issues("team/engine")
    body = issue["body"]
    section = body[body.index("<!-- optbot-dashboard-section: store-check -->"):]
    assert f"| {GONE} | no-longer-applies | retired |" in section and f"| {KEPT} | holds | none |" in section
    assert f"#{first['proposal']['pr']['number']}" in section and nightly["tip"][:12] in section
    assert f"- [ ] re-validate {KEPT} <!-- optbot-request: revalidate {KEPT} -->" in section
    # a maintainer ticks the box in GitHub's editor (\r\n line ends) and writes a note outside the sections
    ticked = body.replace(f"- [ ] re-validate {KEPT}", f"- [x] re-validate {KEPT}").replace("\n", "\r\n")
    gh.edit_issue("team/engine", issue["number"], ticked + "\r\nnote from a maintainer\r\n")
    second, r = _check(cli_runner, nightly, *args)
    assert "dashboard: updated" in r.stdout, r.output
    (issue,) = gh.issues("team/engine")  # still the one issue
    assert f"- [ ] re-validate {KEPT} <!-- optbot-request: revalidate {KEPT} -->" in issue["body"]
    assert "note from a maintainer" in issue["body"]


def test_without_the_engine_repository_the_dashboard_is_left_alone(cli_runner, nightly, gh):
    _, r = _check(cli_runner, nightly, "--knowledge-repo", "team/optbot")
    assert "dashboard: not updated (no --repo" in r.stderr and gh.issues("team/optbot") == []


def test_nothing_to_propose_opens_nothing(cli_runner, nightly, gh):
    """Against the entries' own base everything applies: no branch, no pull request."""
    out = nightly["tmp"] / "base.json"
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(nightly["knowledge"].working_tree_dir),
                                "--no-kernels", "--propose", "--knowledge-repo", "team/optbot", "--json", str(out)])
    assert r.exit_code == 0, r.output
    p = json.loads(out.read_text())["proposal"]
    assert p["pr"]["action"] == "none" and p["files"] == [] and gh.pulls("team/optbot") == []
    assert "optbot/store-check/all" not in [h.name for h in nightly["knowledge"].heads]


def test_an_entry_of_another_engine_is_not_checked(cli_runner, nightly):
    """--engine sglang=PATH checks only sglang's entries: the diffusers entries are said so."""
    out = nightly["tmp"] / "other.json"
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(nightly["knowledge"].working_tree_dir),
                                "--engine", f"sglang={nightly['engine'].working_tree_dir}", "--no-kernels",
                                "--json", str(out)])
    assert r.exit_code == 0, r.output
    for e in json.loads(out.read_text())["entries"]:
        assert [c["name"] for c in e["checks"]] == ["schema", "engine"]
        assert e["checks"][1]["ok"] is None and "an entry of engine diffusers" in e["checks"][1]["reason"]


def test_bad_combinations_are_clear_errors(cli_runner, nightly, tmp_path):
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(nightly["knowledge"].working_tree_dir),
                                "--propose", "--record"])
    assert r.exit_code == 2 and "give one" in r.output
    plain = tmp_path / "plain"
    shutil.copytree(SHIPPED_STORE / KEPT, plain / "kernel_store" / KEPT)
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(plain), "--propose", "--no-kernels"])
    assert r.exit_code != 0 and "is not a git repository" in str(r.exception)


def test_a_token_without_a_knowledge_repository_is_a_clear_error(cli_runner, nightly, gh):
    r = cli_runner.invoke(cli, ["store", "check", "--knowledge-path", str(nightly["knowledge"].working_tree_dir),
                                "--engine", str(nightly["engine"].working_tree_dir), "--no-kernels", "--propose"])
    assert r.exit_code != 0 and "--knowledge-repo OWNER/NAME" in str(r.exception)
    assert gh.pulls("team/optbot") == []
