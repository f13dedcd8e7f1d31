"""The template generator end to end on small models in a temp "engine" repo: real capture
(runner/graph_capture), real profile and analyzer, then lift -> emit -> rewrite -> commit; the
emitted kernel under TRITON_INTERPRET=1 (a child process) against its reference and the original
model; and the refusals, with their reasons."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bot.analyze.opportunity import Estimate, Location, Opportunity
from bot.engine import EngineCheckout
from bot.generate.template.generator import TemplateContext, generate_templates
from bot.knowledge.check import run_kernel_tests
from bot.knowledge.store import load_entry
from bot.trailers import parse_trailers
from bot.validate.correctness import kernel_tests_for
from bot.validate.resolve import Revision

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ROLES = {"pixels": "latents", "words": "prompt", "tau": "timestep"}

CHECK = r'''
import json, os, sys, importlib.util
import torch
wt, cls, entry, out = sys.argv[1:5]
sys.path.insert(0, wt)
from toyeng import model as M
# the kernel package imports its kernels with the engine, never the tests committed beside them
assert not [m for m in sys.modules if ".test_" in m or m.startswith("test_")], "a kernel test was imported"
# the entry's kernel module: its own test inputs, fresh seeds, every shape
test_file = next(p for p in os.listdir(entry) if p.startswith("test_"))
spec = importlib.util.spec_from_file_location("t", os.path.join(entry, test_file))
t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)
worst = 0.0
for shape in t.SHAPES:
    for seed in (3, 4):
        ins = t.make_inputs(shape, "float32", "cpu", seed)
        k, r = t.kernel(*ins), t.reference(*ins)
        assert t.kernel_path() == "triton", t.kernel_path()
        worst = max(worst, (k - r).abs().max().item())
torch.manual_seed(0)
m = getattr(M, cls)().eval()
kw = m.example(7)
with torch.inference_mode():
    fused = m(**kw)
    os.environ["TRITON_INTERPRET"] = "0"  # the wrapper's torch path: the reference replay of the ops
    ref = m(**kw)
torch.save({"fused": fused, "ref": ref}, out)
print(json.dumps({"kernel_vs_reference": worst}))
'''


def _engine(tmp_path: Path) -> EngineCheckout:
    repo_dir = tmp_path / "engine"
    (repo_dir / "toyeng").mkdir(parents=True)
    (repo_dir / "toyeng" / "__init__.py").write_text("")
    shutil.copy(HERE / "template_models.py", repo_dir / "toyeng" / "model.py")
    repo = git.Repo.init(repo_dir)
    repo.git.add("-A")
    repo.git.commit("-qm", "engine", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                          "GIT_COMMITTER_EMAIL": "t@t"})
    return EngineCheckout("toy", repo_dir, repo.head.commit.hexsha, "HEAD", "")


def _base_model(checkout: EngineCheckout, cls: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"toyeng_base_{cls}", checkout.repo_path / "toyeng" / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _analyze(checkout: EngineCheckout, cls: str, tmp_path: Path):
    """Capture and profile one step of model `cls` of the engine (as tests/analyze/toy_helpers.py)."""
    import torch

    from bot.analyze.graph import Graph
    from bot.analyze.run import analyze
    from runner.graph_capture import capture
    from runner.profiler import profile_step

    sys.path.insert(0, str(checkout.repo_path))
    try:
        import toyeng.model as M
    finally:
        sys.path.remove(str(checkout.repo_path))
    torch.manual_seed(0)
    model = getattr(M, cls)().eval().requires_grad_(False)
    kw = model.example(0)

    def step():
        with torch.inference_mode():
            return model(**kw)

    step()
    rec = capture(model, step, str(checkout.repo_path), ROLES)
    graph = Graph.from_json({**rec.to_json(), "device": "cpu", "probes": []})
    prof = profile_step(model, step, "cpu", tmp_path / f"trace-{cls}.json.gz")
    profile = {**prof, "device": "cpu", "total_ms": prof["busy_ms"] * 1.5, "idle_ms": None, "passes": 1,
               "peaks": {"copy_gbps": 20.0, "matmul_tflops": 0.2}, "env": {"device_kind": "cpu", "device_name": "test"}}
    ana = analyze(graph, profile, {}, "test")
    opps = [Opportunity(**{**o, "location": Location(**o["location"]), "estimate": Estimate(**o["estimate"])})
            for o in ana["opportunities"]]
    return graph, opps


def _ctx(tmp_path: Path, covered=frozenset()) -> TemplateContext:
    return TemplateContext(workload="toy", engine="toy", engine_source="git:toy", hardware="cpu",
                           run_id="20261201-000000-optimize-abc123", entries_dir=tmp_path / "entries",
                           covered=frozenset(covered), min_gain_pct=0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return _engine(tmp_path_factory.mktemp("tpl"))


CASES = [
    ("NormModulate", "fuse-norm-consumer", "add -> layer_norm -> mul -> add",
     "(1 + scale) * self.norm(x) + shift", "(scale, x, shift)"),
    ("AffineGelu", "fuse-norm-consumer", "layer_norm -> gelu -> mul",
     'torch.nn.functional.gelu(self.norm(pixels), approximate="tanh") * gate', "(pixels, self.norm.weight, self.norm.bias, gate)"),
    ("RmsWeight", "fuse-norm-consumer", "pow -> mean -> add -> rsqrt -> mul -> mul -> add",
     "h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w + shift", "(h, self.w, shift)"),
    ("Chain", "fuse-elementwise-chain", "sigmoid -> mul -> mul", "pixels * torch.sigmoid(pixels) * y", "(pixels, y)"),
    # two statements (FLUX.2's norm, then its modulation on the next line), joined into one
    ("TwoStatements", "fuse-norm-consumer", "layer_norm -> mul -> add", "h = h * (1 + scale) + shift",
     "h = _optbot_kernels.tpl_layer_norm_mul_add_"),
    # a return (SGLang's _flux2_norm_modulate): the statement hands its value on as an assignment does
    ("ReturnModulate", "fuse-norm-consumer", "layer_norm -> add -> mul -> add", "return self.norm(x) * (1 + scale) + shift",
     "(x, scale, shift)"),
    # across a call (Qwen-Image's block): the norm in forward, its modulation in the helper's return
    ("HelperModulate", "fuse-norm-consumer", "layer_norm -> add -> mul -> add", "return x * (1 + scale_result) + shift_result, gate_result",
     ", _optbot_fused=_optbot_kernels.tpl_layer_norm_add_mul_"),  # either stream's norm ranks first
]


@pytest.mark.parametrize("cls, kind, program, old, call_args", CASES)
def test_template_end_to_end(engine, tmp_path, cls, kind, program, old, call_args):
    import torch

    graph, opps = _analyze(engine, cls, tmp_path)
    opp = next(o for o in opps if o.kind == kind)
    (res,) = [r for r in generate_templates(engine, graph, [opp], _ctx(tmp_path))]
    assert res.status == "candidate", res.reason
    assert res.program == program
    c = res.candidate
    wt = Path(c.worktree)
    # the commit: the rewritten statement, the kernel module beside the engine file, the trailers
    msg = git.Repo(wt).commit(c.commit_sha).message
    tr = parse_trailers(msg)
    assert tr["Optbot-Kind"] == kind and tr["Optbot-Opportunity"] == opp.id
    assert tr["Optbot-Adds-Kernels"] == c.adds_kernels[0] and c.adds_kernels[0].endswith("_kernel")
    assert tr["Optbot-Entry"] == "none" and tr["Optbot-Generator"] == "template"
    src = (wt / "toyeng" / "model.py").read_text()
    base = (engine.repo_path / "toyeng" / "model.py").read_text()
    assert old in base and old not in src and call_args in src
    kfiles = list((wt / "toyeng" / "optbot_kernels").glob("tpl_*.py"))
    assert len(kfiles) == 1 and c.adds_kernels[0] in kfiles[0].read_text()
    # its test is committed beside it and declared: the validator's kernel check runs it
    assert tr["Optbot-Kernel-Tests"] == f"toyeng/optbot_kernels/test_{kfiles[0].name}"
    rev = Revision(c.commit_sha, c.commit_sha, c.base_sha, wt, trailers={"Optbot-Kernel-Tests": [tr["Optbot-Kernel-Tests"]]})
    assert kernel_tests_for(rev, tmp_path) == [str((wt / tr["Optbot-Kernel-Tests"]).resolve())]
    # the entry files: parse as a store entry, with the kernel, its test and a config space
    entry = load_entry(res.entry_dir)
    assert entry.id == res.entry_dir.name and entry.id.startswith("toy-fuse-")
    assert entry.status == "candidate" and entry.pattern == kind and entry.config_space
    assert [p.name for p in entry.kernel_files()] == [kfiles[0].name] and len(entry.test_files()) == 1
    assert (res.entry_dir / "patch.diff").read_text().count("diff --git") == 4  # engine file, package, kernel, test
    assert (res.entry_dir / "bench.json").is_file()
    # kernel vs reference (fresh seeds, every test shape) and the rewritten model vs the original
    out = tmp_path / "out.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHECK, str(wt), cls, str(res.entry_dir), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["kernel_vs_reference"] < 1e-4
    got = torch.load(out)
    M = _base_model(engine, cls)
    torch.manual_seed(0)
    m = getattr(M, cls)().eval()
    with torch.inference_mode():
        want = m(**m.example(7))
    torch.testing.assert_close(got["ref"], want, atol=1e-5, rtol=1e-5)  # the reference replays the original
    torch.testing.assert_close(got["fused"], want, atol=1e-4, rtol=1e-4)  # the Triton kernel in the model
    # the store's own kernel check (the kernel_test runner job, as `optbot store check` runs it): fp32 and bf16
    (chk,) = run_kernel_tests(entry, str(wt), "", "cpu", tmp_path / "check", params={"seeds": [0]})
    assert chk.ok, chk.reason
    assert {case["path"] for case in chk.details["cases"]} == {"triton"}
    assert {case["dtype"] for case in chk.details["cases"]} == {"float32", "bfloat16"}


@pytest.mark.parametrize("cls, kind, why", [
    ("NotAdjacent", "fuse-norm-consumer", "are not adjacent in one block"),
    ("Clamped", "fuse-elementwise-chain", "aten::clamp is not in the template's table"),
    # across a call: the helper reads its parameter besides the modulation (x.shape), or the norm's
    # weight would have to be named in a helper that serves several norms
    ("HelperReadsInput", "fuse-norm-consumer", "_modulate reads 'x' outside the fused expression"),
    ("HelperAffine", "fuse-norm-consumer", "the norm has a weight or bias"),
])
def test_refusals_name_the_reason(engine, tmp_path, cls, kind, why):
    graph, opps = _analyze(engine, cls, tmp_path)
    opp = next(o for o in opps if o.kind == kind)
    (res,) = generate_templates(engine, graph, [opp], _ctx(tmp_path))
    assert res.status == "refused" and res.candidate is None
    assert why in res.reason, res.reason


def test_covered_opportunity_is_skipped(engine, tmp_path):
    graph, opps = _analyze(engine, "Chain", tmp_path)
    opp = next(o for o in opps if o.kind == "fuse-elementwise-chain")
    (res,) = generate_templates(engine, graph, [opp], _ctx(tmp_path, {opp.id}))
    assert res.status == "covered" and res.candidate is None


def test_an_opportunity_under_the_validators_resolution_is_not_written(engine, tmp_path):
    """Estimated under MIN_GAIN_PCT of the step: `small`, with the estimate in the reason, no commit."""
    import dataclasses

    from bot.generate.template.generator import MIN_GAIN_PCT

    graph, opps = _analyze(engine, "Chain", tmp_path)
    opp = next(o for o in opps if o.kind == "fuse-elementwise-chain")
    small = dataclasses.replace(opp, gain_pct=MIN_GAIN_PCT / 2)
    (res,) = generate_templates(engine, graph, [small], dataclasses.replace(_ctx(tmp_path), min_gain_pct=MIN_GAIN_PCT))
    assert res.status == "small" and res.candidate is None and f"under {MIN_GAIN_PCT}%" in res.reason
    big = dataclasses.replace(opp, gain_pct=MIN_GAIN_PCT * 2)
    (res,) = generate_templates(engine, graph, [big], dataclasses.replace(_ctx(tmp_path / "b"), min_gain_pct=MIN_GAIN_PCT))
    assert res.status == "candidate", res.reason


def test_generate_step_runs_the_template_after_replay(engine, tmp_path, monkeypatch):
    """bot/steps/generate._template: reads the run's graph, adds the candidate, and skips an
    opportunity a replayed entry covers, with a note each."""
    import dataclasses
    from types import SimpleNamespace

    from bot.run.context import Budget, RunContext, RunOptions
    from bot.run.state import Results
    from bot.steps import generate

    graph, opps = _analyze(engine, "Chain", tmp_path)
    gfile = tmp_path / "graph.json"
    gfile.write_text(json.dumps(graph.raw))
    (tmp_path / "analysis.full.json").write_text(json.dumps({"meta": {"graph_file": str(gfile)}}))
    ctx = RunContext("r", tmp_path, RunOptions(workload="toy", generators=("replay", "template")), Budget(), Results(),
                     log=lambda m: None)
    ctx._target = SimpleNamespace(device="cpu", dtype="bfloat16", preset="tiny", engine_name="toy",
                                  workload=SimpleNamespace(name="toy", default_engine="toy"), checkout=engine)
    monkeypatch.setattr(RunContext, "hardware", lambda self: "cpu")
    # the toy's chain is a sliver of a CPU step; as a share of the step the analyzer could find it
    # big (a real model's), so the step's MIN_GAIN_PCT rule passes it
    chain = [dataclasses.replace(o, gain_pct=5.0) for o in opps if o.kind == "fuse-elementwise-chain"]
    res = generate.Result("done", "")
    notes = generate._template(ctx, [], chain, res)
    assert [c.generator for c in res.candidates] == ["template"] and res.candidates[0].opportunity_id == chain[0].id
    assert "sigmoid -> mul -> mul" in notes[0] and (tmp_path / "template").is_dir()
    # learn gives the learned entry the config space the template wrote for this commit (and no other's)
    from bot.steps.learn import _template_config_space
    (written,) = (tmp_path / "template").iterdir()
    assert load_entry(written).dtypes == ("bfloat16",)  # the run's dtype (the capture is fp32, the entry is not)
    space = _template_config_space(ctx, res.candidates[0].commit_sha)
    assert space and space == load_entry(written).config_space
    assert _template_config_space(ctx, engine.base_sha) == {}
    res2 = generate.Result("done", "")
    replayed = SimpleNamespace(opportunity_id=chain[0].id, entry_id="e", candidate=SimpleNamespace(commit_sha=engine.base_sha))
    notes = generate._template(ctx, [replayed], chain, res2)
    assert res2.candidates == [] and "skipped, a replayed store entry covers it" in notes[0]


def test_two_template_commits_of_one_file_stack(engine, tmp_path):
    """Two rewrites in one engine file (two model classes of toyeng/model.py) each add the package's
    one import line and its __init__.py, the same text at the same place: the second commit
    cherry-picks cleanly onto the first (with an import line per kernel they conflicted), and the
    stacked file imports and runs both kernels."""
    from bot.engine import add_worktree

    shas = []
    for cls, kind in (("NormModulate", "fuse-norm-consumer"), ("Chain", "fuse-elementwise-chain")):
        graph, opps = _analyze(engine, cls, tmp_path)
        (res,) = generate_templates(engine, graph, [next(o for o in opps if o.kind == kind)], _ctx(tmp_path / cls))
        assert res.status == "candidate", res.reason
        shas.append(res.candidate.commit_sha)
    wt = add_worktree(engine, "tpl-stack-two")
    r = git.Repo(wt)
    for sha in shas:
        r.git.cherry_pick(sha)  # raises on a conflict
    src = (wt / "toyeng" / "model.py").read_text()
    assert src.count("import optbot_kernels as _optbot_kernels") == 1 and src.count("_optbot_kernels.tpl_") == 2
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{wt}{os.pathsep}{ROOT}"}
    probe = ("import torch; from toyeng import model as M\n"
             "for c in ('NormModulate', 'Chain'):\n"
             "    torch.manual_seed(0); m = getattr(M, c)().eval(); m(**m.example(1))\n"
             "import toyeng.optbot_kernels as k; print(sorted(n for n in dir(k) if n.startswith('tpl_')))")
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(eval(proc.stdout.strip().splitlines()[-1])) == 2


def test_one_statement_at_two_module_paths_is_written_once(engine, tmp_path):
    """SharedStatement runs Gate.forward's line as img_gate and as txt_gate: two chain
    opportunities, one rewrite; the second is `duplicate`, names the first, and leaves no worktree."""
    graph, opps = _analyze(engine, "SharedStatement", tmp_path)
    chains = [o for o in opps if o.kind == "fuse-elementwise-chain" and o.location.module_pattern in ("img_gate", "txt_gate")]
    assert {o.location.module_pattern for o in chains} == {"img_gate", "txt_gate"}
    res = generate_templates(engine, graph, chains, _ctx(tmp_path))
    by = {r.status: r for r in res}
    # (the third, the sum `a + b` in a return, is refused on its own)
    assert sorted(r.status for r in res if r.status != "refused") == ["candidate", "duplicate"], \
        [(r.status, r.reason) for r in res]
    assert f"template-{by['candidate'].opportunity_id} rewrites" in by["duplicate"].reason
    assert not by["duplicate"].worktree and by["duplicate"].candidate is None
    wts = git.Repo(engine.repo_path).git.worktree("list")
    assert f"template-{by['duplicate'].opportunity_id}" not in wts


def test_a_line_a_replayed_entry_changes_is_left_to_it(engine, tmp_path):
    """A replayed entry's patch may rewrite more than the opportunity it was matched to (FLUX.2's
    norm-modulate entry also rewrites the double blocks' norm1/norm2 lines): a template candidate on
    such a line would not stack with it, so it is `covered`, naming the entry; no worktree is left."""
    from bot.engine import add_worktree
    from bot.generate.template.generator import changed_lines

    graph, opps = _analyze(engine, "Chain", tmp_path)
    opp = next(o for o in opps if o.kind == "fuse-elementwise-chain")
    wt = add_worktree(engine, "replayed-entry-edit")
    f = wt / "toyeng" / "model.py"
    f.write_text(f.read_text().replace("g = pixels * torch.sigmoid(pixels) * y", "g = torch.sigmoid(pixels) * pixels * y"))
    r = git.Repo(wt)
    r.git.commit("-qam", "entry", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                       "GIT_COMMITTER_EMAIL": "t@t"})
    claimed = tuple(changed_lines(engine, r.head.commit.hexsha, "store entry toy-chain"))
    assert [c[0] for c in claimed] == ["toyeng/model.py"]
    import dataclasses
    (res,) = generate_templates(engine, graph, [opp], dataclasses.replace(_ctx(tmp_path), claimed=claimed))
    assert res.status == "covered" and "changed by store entry toy-chain" in res.reason, res.reason
    assert f"template-{opp.id}" not in git.Repo(engine.repo_path).git.worktree("list")
    # a change elsewhere in the file does not cover it
    (res,) = generate_templates(engine, graph, [opp], dataclasses.replace(
        _ctx(tmp_path / "b"), claimed=(("toyeng/model.py", 1, 2, "store entry other"),)))
    assert res.status == "candidate", res.reason


def test_leaving_the_first_template_commit_out_keeps_the_second_runnable(engine, tmp_path):
    """The stack's first template commit brings the kernel package and the import line the second
    uses: reverting it (leave-one-out as `optbot ablate` does on a bare stack) breaks the second
    kernel's model, as on FLUX.2 on the H200; the ablation's rebuild from the members' own commits
    (combine passes them) leaves a tree where the second runs."""
    from types import SimpleNamespace

    from bot.engine import add_worktree
    from bot.validate.ablate import _rebuilt_worktree, _revert_worktree

    shas = []
    for cls, kind in (("NormModulate", "fuse-norm-consumer"), ("Chain", "fuse-elementwise-chain")):
        graph, opps = _analyze(engine, cls, tmp_path)
        (res,) = generate_templates(engine, graph, [next(o for o in opps if o.kind == kind)], _ctx(tmp_path / cls))
        shas.append(res.candidate.commit_sha)
    wt = add_worktree(engine, "tpl-stack-ablate")
    r = git.Repo(wt)
    for sha in shas:
        r.git.cherry_pick(sha)
    target = SimpleNamespace(checkout=engine)  # what the two helpers read of a Target
    probe = ("import torch; from toyeng import model as M\n"
             "torch.manual_seed(0); m = M.Chain().eval(); m(**m.example(1))")

    def runs(tree):
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)

    reverted, note = _revert_worktree(target, r.head.commit.hexsha, r.head.commit.parents[0].hexsha)
    assert reverted is not None and note == ""
    assert runs(reverted).returncode != 0  # the import line and the package went with the first commit
    rebuilt, note = _rebuilt_worktree(target, engine.base_sha, shas, 0)
    assert rebuilt is not None and note == "", note
    proc = runs(rebuilt)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "_optbot_kernels.tpl_" in (rebuilt / "toyeng" / "model.py").read_text()


def test_two_norms_through_one_helper_are_one_kernel_at_both_places(engine, tmp_path):
    """HelperModulate's image and text norms both go through `_modulate`: one program at two
    statements, with streams of two lengths, so one candidate with one kernel rewires both (as
    Qwen-Image's img_norm1/img_norm2/txt_norm1/txt_norm2, each alone inside the validator's noise);
    the other opportunity is `grouped`, naming it. The helper edit is made once, the model runs the
    one kernel for both streams and matches the original, and the kernel's test covers both shapes."""
    import torch

    graph, opps = _analyze(engine, "HelperModulate", tmp_path)
    norms = [o for o in opps if o.kind == "fuse-norm-consumer"]
    assert {o.location.module_pattern for o in norms} == {"img_norm", "txt_norm"}
    res = generate_templates(engine, graph, norms, _ctx(tmp_path))
    assert [r.status for r in res] == ["candidate", "grouped"], [r.reason for r in res]
    cand = res[0].candidate
    assert f"in template-{res[0].opportunity_id}" in res[1].reason and res[1].candidate is None
    assert cand.estimated_gain_ms == pytest.approx(sum(o.gain_ms for o in norms), abs=1e-4)
    wt = Path(cand.worktree)
    repo = git.Repo(wt)
    assert repo.head.commit.hexsha == cand.commit_sha and repo.head.commit.parents[0].hexsha == engine.base_sha
    msg = repo.head.commit.message
    assert "one kernel at 2 place(s)" in msg and "and 1 more place(s)" in msg.splitlines()[0]
    assert all(o.id in msg for o in norms)
    # each place's "now:" is its rewritten call statement, not the class around it
    assert "class HelperModulate" not in msg and "now: img_modulated, img_gate = self._modulate(pixels, img_mod" in msg
    src = (wt / "toyeng" / "model.py").read_text()
    kname = cand.adds_kernels[0][1:-len("_kernel")]
    assert src.count("_optbot_fused=None") == 1 and src.count(f"_optbot_fused=_optbot_kernels.{kname}.{kname}") == 2
    assert "self.img_norm(" not in src and "self.txt_norm(" not in src
    assert [f.name for f in (wt / "toyeng" / "optbot_kernels").glob("tpl_*.py")] == [f"{kname}.py"]
    test_src = (wt / "toyeng" / "optbot_kernels" / f"test_{kname}.py").read_text()
    assert "(2, 5, 32)" in test_src and "(2, 3, 32)" in test_src  # both streams' captured shapes
    entry = load_entry(res[0].entry_dir)
    assert entry.id.endswith("-and-1-more") and len(entry.test_files()) == 1
    out = tmp_path / "stack.pt"
    probe = ("import sys, torch; from toyeng import model as M; import toyeng.optbot_kernels as k\n"
             "ran = []\n"
             "for name in [n for n in dir(k) if n.startswith('tpl_')]:\n"
             "    mod = getattr(k, name); f = getattr(mod, name)\n"
             "    def spy(*a, _f=f): ran.append(tuple(a[0].shape)); return _f(*a)\n"
             "    setattr(mod, name, spy)\n"
             "torch.manual_seed(0); m = M.HelperModulate().eval()\n"
             "with torch.inference_mode(): y = m(**m.example(7))\n"
             "torch.save(y, sys.argv[1]); print(sorted(ran))")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{wt}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", probe, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert eval(proc.stdout.strip().splitlines()[-1]) == [(2, 3, 32), (2, 5, 32)]  # the one kernel, both streams
    M = _base_model(engine, "HelperModulate")
    torch.manual_seed(0)
    m = M.HelperModulate().eval()
    with torch.inference_mode():
        want = m(**m.example(7))
    torch.testing.assert_close(torch.load(out), want, atol=1e-4, rtol=1e-4)


def test_kernel_key_ignores_row_counts_and_nothing_else(engine, tmp_path):
    """Sites group by kernel_key: the two streams' programs (5 and 3 rows) share one; another eps, a
    broadcast over another dim or another op sequence does not."""
    import dataclasses

    from bot.generate.template.emit import kernel_key
    from bot.generate.template.lift import instances, lift

    graph, opps = _analyze(engine, "HelperModulate", tmp_path)
    img, txt = [lift(graph, o, instances(graph, o)[0]) for o in opps if o.kind == "fuse-norm-consumer"]
    assert img.out_shape != txt.out_shape and kernel_key(img) == kernel_key(txt)
    norm = next(n for n in img.nodes if n.op == "layer_norm")
    eps = dataclasses.replace(img, nodes=[dataclasses.replace(n, attrs={**n.attrs, "eps": 1e-5}) if n is norm else n
                                          for n in img.nodes])
    assert kernel_key(eps) != kernel_key(img)
    b = next(i for i in img.inputs if i.role == "bcast")
    wide = dataclasses.replace(img, inputs=[dataclasses.replace(i, shape=img.out_shape, role="row") if i is b else i
                                            for i in img.inputs])
    assert kernel_key(wide) != kernel_key(img)
    graph2, opps2 = _analyze(engine, "NormModulate", tmp_path)
    other = lift(graph2, next(o for o in opps2 if o.kind == "fuse-norm-consumer"))
    assert kernel_key(other) != kernel_key(img)
