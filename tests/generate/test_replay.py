"""Store replay on real git worktrees of the diffusers engine: commits with trailers, stacking,
and a conflict that is recorded, not raised."""
from __future__ import annotations

import subprocess

import git
import pytest

from bot.engine import add_worktree
from bot.generate.candidate import TRAILER_KEYS
from bot.generate.replay import apply_entry, match, replay, superseded_by
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry, load_store
from bot.trailers import parse_trailers, trailer_values
from tests.fakes import opportunity

OPPS = [opportunity(kind, id=oid) for oid, kind in (("opp-3", "fuse-elementwise-chain"), ("opp-1", "attention-waste"),
                                                    ("opp-2", "attention-waste"), ("opp-9", "launch-bound"),
                                                    ("opp-4", "absorb-bias"), ("opp-5", "hoist-constant"))]
# the Qwen-Image entries in use (drop-all-ones-mask is retired: it dropped an all-ones text mask no
# pipeline passes)
QWEN_SEEDS = ("qwen-image-cfg-modulation-cache", "qwen-image-absorb-bias", "qwen-image-qkv-norm-rope-epilogue",
              "qwen-image-hoist-host-copies", "qwen-image-linear-gelu-epilogue", "qwen-image-norm-modulate")


def test_match_by_kind_engine_hardware_workload():
    pairs = {(e.id, o) for e, o in match(load_store(SHIPPED_STORE), OPPS, "diffusers", "h200", "flux2")}
    assert pairs == {("flux2-swiglu", "opp-3"), ("flux2-qk-rmsnorm-rope", "opp-1"),
                     ("flux2-qkv-norm-rope-epilogue", "opp-1")}
    # by engine: the SGLang entry (retired: its gain was against an attention path production does not
    # run) would match SGLang's FLUX.2 on the GPU it targets, nothing else; it is reported, not applied
    assert match(load_store(SHIPPED_STORE), OPPS, "sglang", "h200", "flux2") == []
    assert {(e.id, o) for e, o in match(load_store(SHIPPED_STORE), OPPS, "sglang", "h200", "flux2",
                                        unusable=True)} == {("sglang-flux2-cudnn-attention", "opp-1")}
    assert match(load_store(SHIPPED_STORE), OPPS, "sglang", "cpu", "flux2", unusable=True) == []
    assert match(load_store(SHIPPED_STORE), OPPS, "sglang", "h200", "qwen-image", unusable=True) == []
    assert {(e.id, o) for e, o in match(load_store(SHIPPED_STORE), OPPS, "diffusers", "h200", "qwen-image")} == {
        ("qwen-image-qkv-norm-rope-epilogue", "opp-1"), ("qwen-image-absorb-bias", "opp-4"),
        ("qwen-image-hoist-host-copies", "opp-5")}
    assert {(e.id, o) for e, o in match(load_store(SHIPPED_STORE), OPPS, "diffusers", "h200", "qwen-image",
                                        unusable=True)} == {("qwen-image-drop-all-ones-mask", "opp-1")}


def test_replay_commits_candidates_with_trailers(diffusers_engine):
    results = replay(diffusers_engine, OPPS, "diffusers", "h200", workload="flux2", store_root=SHIPPED_STORE)
    assert [r.status for r in results] == ["applied"] * 3, [r.reason for r in results]
    for r in results:
        c = r.candidate
        repo = git.Repo(c.worktree)
        head = repo.head.commit
        assert head.hexsha == c.commit_sha and head.parents[0].hexsha == diffusers_engine.base_sha
        trailers = parse_trailers(head.message)
        assert list(trailers) == list(TRAILER_KEYS)
        assert trailers["Optbot-Entry"] == r.entry_id == c.entry_id
        assert trailers["Optbot-Opportunity"] == c.opportunity_id
        assert trailer_values(trailers["Optbot-Adds-Kernels"]) == list(get_entry(r.entry_id, SHIPPED_STORE).adds_kernels)
        assert not repo.is_dirty(untracked_files=True)
        assert any(p.startswith("src/diffusers/models/optbot_kernels/") for p in head.stats.files)


@pytest.mark.parametrize("group", [("flux2-qk-rmsnorm-rope", "flux2-swiglu", "flux2-norm-modulate", "flux2-merge-qkv"),
                                   ("flux2-qkv-norm-rope-epilogue", "flux2-swiglu", "flux2-norm-modulate"),
                                   QWEN_SEEDS])
def test_seed_patches_stack(diffusers_engine, group):
    """The seed entries of one workload apply on top of each other (edits at distinct anchors)."""
    onto = None
    for eid in group:
        r = apply_entry(diffusers_engine, get_entry(eid, SHIPPED_STORE), f"opp-{eid}", name=f"test-stack-{eid}", onto=onto)
        assert r.status == "applied", r.reason
        onto = r.candidate.commit_sha
    log = git.Repo(r.worktree).git.log("--format=%s", f"{diffusers_engine.base_sha}..{onto}").splitlines()
    assert len(log) == len(group)


def test_qwen_seed_patches_stack_in_any_order(diffusers_engine):
    """The Qwen-Image entries edit transformer_qwenimage.py at distinct anchors: every entry first,
    last and next to every other (the rotations of the list and of its reverse) applies, and every
    order ends at the same tree. (All 24 permutations of the first four entries took 90 s on 2 cores and
    found nothing more.)"""
    trees = set()
    orders = [QWEN_SEEDS[i:] + QWEN_SEEDS[:i] for i in range(len(QWEN_SEEDS))]
    orders += [tuple(reversed(o)) for o in orders]
    for n, order in enumerate(orders):
        onto = None
        for eid in order:
            r = apply_entry(diffusers_engine, get_entry(eid, SHIPPED_STORE), f"opp-{eid}", name=f"test-qwen-order{n}-{eid}", onto=onto)
            assert r.status == "applied", (order, r.reason)
            onto = r.candidate.commit_sha
        trees.add(git.Repo(r.worktree).head.commit.tree.hexsha)
    assert len(trees) == 1


@pytest.mark.parametrize("first", ["flux2-merge-qkv", "flux2-qk-rmsnorm-rope"])
def test_epilogue_entry_conflicts_with_what_it_supersedes(diffusers_engine, first):
    """flux2-qkv-norm-rope-epilogue rewrites the code these entries change (its entry.yaml says so):
    stacked on either, replay records a conflict on transformer_flux2.py instead of a broken commit."""
    r = apply_entry(diffusers_engine, get_entry(first, SHIPPED_STORE), "opp-a", name=f"test-supersede-{first}")
    assert r.status == "applied", r.reason
    c = apply_entry(diffusers_engine, get_entry("flux2-qkv-norm-rope-epilogue", SHIPPED_STORE), "opp-b",
                    name=f"test-supersede-{first}-epilogue", onto=r.candidate.commit_sha)
    assert c.status == "conflict", c.reason
    assert "src/diffusers/models/transformers/transformer_flux2.py" in c.conflicts


def test_conflict_is_recorded_not_fatal(diffusers_engine):
    # A base where someone else already rewrote Flux2SwiGLU.forward differently.
    wt = add_worktree(diffusers_engine, "test-conflict-base")
    f = wt / "src/diffusers/models/transformers/transformer_flux2.py"
    text = f.read_text()
    old = "        x = self.gate_fn(x[..., :half]) * x[..., half:]\n"
    assert old in text
    f.write_text(text.replace(old, "        x = torch.nn.functional.silu(x[..., :half]) * x[..., half:]  # changed upstream\n"))
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "upstream change"], cwd=wt, check=True)
    onto = git.Repo(wt).head.commit.hexsha
    r = apply_entry(diffusers_engine, get_entry("flux2-swiglu", SHIPPED_STORE), "opp-3", name="test-conflict", onto=onto)
    assert r.status == "conflict" and r.candidate is None
    assert "src/diffusers/models/transformers/transformer_flux2.py" in r.conflicts
    assert "does not apply" in r.reason
    repo = git.Repo(r.worktree)
    assert repo.head.commit.hexsha == onto and not repo.is_dirty(untracked_files=True)  # left clean
    assert r.to_json()["status"] == "conflict"


# --- kernels that step aside under torch.compile (replay.under_compile) ---------------------------

ASIDE_PROBE = r'''
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from diffusers.models.optbot_kernels import swiglu as k
from torch._dynamo.testing import CompileCounterWithBackend
x = torch.randn(3, 5, 64)
cnt = CompileCounterWithBackend("aot_eager")
out = torch.compile(k.swiglu, backend=cnt, fullgraph=True)(x)
ops = sorted({str(n.target) for g in cnt.graphs for n in g.graph.nodes if "optbot" in str(n.target)})
print(json.dumps({"under_compile": k.UNDER_COMPILE, "optbot_ops": ops, "path": k.last_path(),
                  "max_abs": (out - k.reference(x)).abs().max().item(), "eager_path": (k.swiglu(x), k.last_path())[1]}))
'''


def _micro_bench(entry_dir, device_name: str, vs_compiled: list[float]):
    """bench.json as `optbot store record-bench` writes a store check's microbenchmark: one row per
    shape with the kernel's speed against the eager reference and against the compiled one."""
    from bot.knowledge.records import MicroRecord, load_bench, save_bench

    b = load_bench(entry_dir)
    rows = [{"shape": [512 * (i + 1), 36864], "dtype": "bfloat16", "speedup": 1.5, "vs_compiled": v}
            for i, v in enumerate(vs_compiled)]
    b.gpu_section().set_micro(MicroRecord(source="test", device="cuda",
                                          tests={"test_swiglu.py": {"micro": rows, "env": {"device_name": device_name}}}))
    save_bench(entry_dir, b)


@pytest.mark.parametrize("device_name, vs, hardware, want", [
    ("NVIDIA H200", [0.8, 0.95], "h200", "reference"),  # loses to inductor at every shape
    ("NVIDIA H200", [0.8, 1.2], "h200", "op"),  # wins somewhere: the kernel stays under compile
    ("NVIDIA H200", [0.8, 0.9], "b200", "op"),  # measured on other hardware: says nothing here
    ("NVIDIA H200", [0.8, 0.9], "cpu", "op"),
])
def test_the_recorded_micro_against_inductor_decides(tmp_path, device_name, vs, hardware, want):
    import shutil

    from bot.generate.replay import under_compile
    from bot.knowledge.store import load_entry

    folder = tmp_path / "flux2-swiglu"
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", folder)
    _micro_bench(folder, device_name, vs)
    choice, why = under_compile(load_entry(folder), hardware)
    assert choice == want, why
    assert (want == "reference") == ("loses to inductor" in why)
    if want == "reference":
        assert "[512, 36864] 0.80x" in why


def test_a_micro_on_another_gpu_keeps_this_ones_decision(tmp_path):
    """An H100 store check records its microbenchmark as the latest; the H200's stays in
    gpu.micro_elsewhere, so replay on the H200 still steps the kernel aside where it lost there."""
    import shutil

    from bot.generate.replay import under_compile
    from bot.knowledge.store import load_entry

    folder = tmp_path / "flux2-swiglu"
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", folder)
    _micro_bench(folder, "NVIDIA H200", [0.8, 0.95])
    _micro_bench(folder, "NVIDIA H100 80GB HBM3", [1.1, 1.2])
    assert under_compile(load_entry(folder), "h200")[0] == "reference"
    assert under_compile(load_entry(folder), "h100")[0] == "op"


def _opp(kind: str, pattern: str, quantized_by: list[str], id: str):
    import dataclasses

    return dataclasses.replace(opportunity(kind, module=pattern, id=id), quantized_by=quantized_by)


@pytest.mark.parametrize("quantized_by, hardware, want", [
    (["quantization-64dcf2579c"], "h200", "reference"),  # an FP8 GEMM quantizes its output: inductor fuses both
    ([], "h200", "op"),  # unquantized (or nothing reads it for a quantization): the kernel stays
    (["quantization-64dcf2579c"], "cpu", "op"),  # no GPU: nothing is timed, the patch stays the entry's
])
def test_an_output_quantized_for_an_fp8_gemm_steps_aside_under_compile(quantized_by, hardware, want):
    """At a place the entry acts on, its kernel computes what an FP8 GEMM's per-token quantization reads
    (Opportunity.quantized_by, from the analyzer's data flow): under compile the entry's kernels run the
    reference, so inductor computes the norm + modulation and the quantization in one pass."""
    from bot.generate.replay import entry_places, under_compile

    e = get_entry("qwen-image-norm-modulate", SHIPPED_STORE)  # no recorded H200 microbenchmark
    norm = _opp("fuse-norm-consumer", "transformer_blocks.*.img_norm2", quantized_by, "fuse-norm-consumer-1")
    choice, why = under_compile(e, hardware, entry_places(e, [norm], norm.id))
    assert choice == want, why
    assert (want == "reference") == ("quantized for an FP8 GEMM at transformer_blocks.*.img_norm2" in why)
    assert under_compile(e, hardware)[0] == "op"  # no places: the entry alone decides
    # an entry of another kind (attention-waste) whose place's value is quantized (FLUX.2's attention output
    # layout copy, before to_out) says nothing of its kernel's output (q, k, v feed attention): it stays
    qkv = get_entry("flux2-qkv-norm-rope-epilogue", SHIPPED_STORE)
    copy = _opp("attention-waste", "single_transformer_blocks.*.attn", quantized_by, "attention-waste-1")
    assert under_compile(qkv, hardware, entry_places(qkv, [copy], copy.id))[0] == "op"


def test_an_entrys_places_are_where_its_declared_kernels_go():
    """flux2-swiglu declares `aten::silu@*gate_fn`: its places are every SwiGLU gate, not the first
    elementwise chain replay matched it to (FLUX.2's modulation MLP); a quantized gate steps it aside.
    An entry that scopes no removed kernel by module has the matched opportunity as its one place."""
    from bot.generate.replay import entry_places, under_compile

    opps = [_opp("fuse-elementwise-chain", "double_stream_modulation_img.linear", [], "chain-mod"),
            _opp("fuse-elementwise-chain", "transformer_blocks.*.ff.act_fn.gate_fn", ["quantization-ff"], "chain-ff"),
            _opp("fuse-elementwise-chain", "single_transformer_blocks.*.attn.mlp_act_fn.gate_fn", [], "chain-single"),
            _opp("fuse-norm-consumer", "transformer_blocks.*.norm1", ["quantization-n1"], "norm-1")]
    swiglu = get_entry("flux2-swiglu", SHIPPED_STORE)
    assert [o.id for o in entry_places(swiglu, opps, "chain-mod")] == ["chain-ff", "chain-single"]
    choice, why = under_compile(swiglu, "h200", entry_places(swiglu, opps, "chain-mod"))
    assert choice == "reference" and "transformer_blocks.*.ff.act_fn.gate_fn (chain-ff) by quantization-ff" in why
    cache = get_entry("qwen-image-cfg-modulation-cache", SHIPPED_STORE)  # removes nothing by module
    assert [o.id for o in entry_places(cache, opps, "norm-1")] == ["norm-1"]


def test_replay_steps_aside_where_an_entrys_place_is_quantized(diffusers_engine):
    """replay() hands each entry its places: the norm + modulation entry's worktree has its kernel
    switched to the reference under compile, and the commit says why."""
    from pathlib import Path

    quantized = _opp("fuse-norm-consumer", "transformer_blocks.*.img_norm2", ["quantization-q"], "fuse-norm-consumer-q")
    (r,) = [r for r in replay(diffusers_engine, [quantized], "diffusers", "h200", "qwen-image")
            if r.entry_id == "qwen-image-norm-modulate"]
    assert r.status == "applied" and r.under_compile == "reference", r.reason
    assert ("quantized for an FP8 GEMM at transformer_blocks.*.img_norm2 (fuse-norm-consumer-q) by quantization-q"
            in r.under_compile_why)
    kernel = Path(r.worktree) / "src/diffusers/models/optbot_kernels/qwen_norm_modulate.py"
    assert 'UNDER_COMPILE = "reference"' in kernel.read_text()
    assert "quantized for an FP8 GEMM" in git.Repo(r.worktree).head.commit.message


def test_a_kernel_set_aside_runs_the_reference_under_compile_only(diffusers_engine, tmp_path):
    """The replay writes UNDER_COMPILE = "reference" into the engine's copy of the kernel; compiled
    (fullgraph), the step holds no optbot op and gives the reference's numbers, while eager still
    takes the Triton path. The same replay without the aside keeps the registered op under compile."""
    import json
    import os
    import sys

    e = get_entry("flux2-swiglu", SHIPPED_STORE)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    seen = {}
    for aside in (("op", ""), ("reference", "test: recorded 0.80x vs compiled")):
        r = apply_entry(diffusers_engine, e, name=f"aside-{aside[0]}", aside=aside)
        assert r.status == "applied" and r.under_compile == aside[0], r.reason
        msg = git.Repo(r.worktree).head.commit.message
        assert ("inductor fuses: test: recorded 0.80x vs compiled" in msg) == (aside[0] == "reference")
        proc = subprocess.run([sys.executable, "-c", ASIDE_PROBE, f"{r.worktree}/src"], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[aside[0]] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["op"]["optbot_ops"] == ["optbot.swiglu.default"] and seen["op"]["path"] == "triton"
    assert seen["reference"]["optbot_ops"] == [] and seen["reference"]["path"] == "torch"
    assert seen["reference"]["under_compile"] == "reference" and seen["reference"]["max_abs"] == 0.0
    assert seen["reference"]["eager_path"] == seen["op"]["eager_path"] == "triton"


def test_the_qwen_stack_with_the_gelu_epilogue_validates_engaged(diffusers_engine, tmp_path):
    """Every Qwen-Image entry stacked, the GELU epilogue too, through the validator on the tiny preset
    (two seeds, no speed): correct and engaged. Each entry alone passed; the stack once failed the
    engagement check (the GELU entry's CPU GEMM ran inside the GELU module, where qwen-image-absorb-bias
    declares the MLP's biased addmm gone)."""
    import importlib.util
    import json

    from tests.test_cli_profile import ROOT, optbot

    spec = importlib.util.spec_from_file_location("stack_patch", ROOT / "benchmarks" / "stack_patch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    patch = tmp_path / "qwen-stack.patch"
    assert "qwen-image-linear-gelu-epilogue" in QWEN_SEEDS
    mod.main("qwen-image", str(patch), list(QWEN_SEEDS))
    out = tmp_path / "v.json"
    r = optbot("validate", "qwen-image", "--candidate", str(patch), "--no-speed", "--seeds", "1,2", "--json", str(out),
               timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(out.read_text())
    assert v["status"] == "accepted", v.get("reason")
    assert v["engagement"]["ok"] and not v["engagement"]["still_present"], v["engagement"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own import
@pytest.mark.filterwarnings("ignore:Float8Tensor does not implement _stable_hash_for_caching:UserWarning")  # torchao's
def test_inductor_fuses_a_norm_with_the_fp8_quantization_unless_an_op_stands_between():
    """The premise of the FP8 step-aside (replay.PRODUCER_KINDS, docs/fp8.md), on the installed torch's
    inductor (CPU backend here; the same script runs on a GPU): compiled from plain ops, the LayerNorm,
    the modulation and the per-token quantization are one generated kernel; with the norm + modulation
    as a registered op, the quantization is a kernel of its own that reads the op's output back."""
    import importlib.util

    from bot.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("inductor_quant_fusion", REPO_ROOT / "benchmarks" / "inductor_quant_fusion.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.main("cpu", 64)

    def quantizing(row):
        return [k for k in row["kernels"] if "amax" in k and "clamp" in k]

    # the emulation (the CPU's recipe) and torchao's Float8Tensor (the GPU's, its scale one op that inductor decomposes)
    assert len(r["recipes"]) == 2 and any(name.startswith("torchao") for name in r["recipes"]), list(r["recipes"])
    for name, rows in r["recipes"].items():
        (fused,) = quantizing(rows["reference ops"])
        assert "native_layer_norm" in fused and "mul" in fused and not rows["reference ops"]["opaque_calls"], name
        (alone,) = quantizing(rows["opaque op"])
        assert "native_layer_norm" not in alone and rows["opaque op"]["opaque_calls"] == ["torch.ops.probe.norm_mod"], name


@pytest.mark.parametrize("switch, stepped", [('UNDER_COMPILE = "reference"', True), ("UNDER_COMPILE_GONE = 1", False)])
def test_a_kernel_file_already_aside_is_kept_and_one_without_the_switch_keeps_the_op(diffusers_engine, tmp_path,
                                                                                      switch, stepped):
    """A kernel file that already steps aside (as the template generator writes them) needs no edit: the
    replay is aside with no complaint. One without the switch cannot be set aside: the replay keeps the
    op and says why."""
    import shutil

    from bot.knowledge.store import load_entry

    folder = tmp_path / "flux2-swiglu"
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", folder)
    for f in [folder / "patch.diff", *folder.glob("*.py")]:
        f.write_text(f.read_text().replace('UNDER_COMPILE = "op"', switch))
    r = apply_entry(diffusers_engine, load_entry(folder), name=f"aside-{stepped}", aside=("reference", "test"))
    assert r.status == "applied", r.reason
    assert (r.under_compile == "reference") == stepped, r.reason
    assert ("not stepping aside" in r.reason) != stepped


def test_an_entry_that_enables_a_mode_is_offered_where_the_run_checks_it():
    """sglang-fp8-quant-compile makes SGLang's FP8 DiT compile; a step that cannot compile shows no
    profile finding, so the entry is offered with no opportunity wherever the run checks one of the
    modes it enables at one of its dtypes, on its engine and hardware, and nowhere else."""
    store = load_store(SHIPPED_STORE)
    four = ("eager", "graph", "compile", "compile+graph")

    def ids(*a, **k):
        return {(e.id, o) for e, o in match(store, OPPS, *a, **k) if e.enables}

    chain = ("sglang-fp8-quant-compile", "sglang-fp8-static-quant-inductor", "sglang-fp8-linear-whole-graph")
    assert ids("sglang", "h200", "flux2", modes=four, precision="bfloat16+fp8") == {(e, "") for e in chain}
    # each includes the one before it and conflicts with it: generate offers only the newest
    newest = chain[-1]
    assert superseded_by(list(chain), store) == {old: newest for old in chain[:-1]}
    # where the newest is not offered (rejected on this machine), the one before it is
    assert superseded_by(list(chain[:-1]), store) == {chain[0]: chain[1]}
    assert ids("sglang", "h100", "flux2", modes=("eager", "compile"), precision="bfloat16+fp8")
    assert not ids("sglang", "h200", "flux2", modes=four, precision="bfloat16")  # bf16 compiles upstream
    assert not ids("sglang", "h200", "flux2", modes=("eager", "graph"), precision="bfloat16+fp8")
    assert not ids("sglang", "cpu", "flux2", modes=("eager",), precision="float32+fp8")
    assert not ids("diffusers", "h200", "flux2", modes=four, precision="bfloat16+fp8")
    # on Qwen-Image only the entry that lists it (SGLang's shared FP8 code; the other two are FLUX.2's)
    assert ids("sglang", "h200", "qwen-image", modes=four, precision="bfloat16+fp8") == {
        ("sglang-fp8-static-quant-inductor", "")}
    assert not ids("sglang", "h200", "qwen-image", modes=("eager", "graph"), precision="bfloat16+fp8")
    # without the run's modes (a caller that does not say), nothing is offered by mode
    assert not ids("sglang", "h200", "flux2")


def test_through_a_chain_of_supersedes_the_last_superseder_stands():
    """flux2-fp8-norm-quant includes flux2-qkv-norm-rope-epilogue, which includes flux2-qk-rmsnorm-rope and
    flux2-merge-qkv: with all offered, each is skipped for the FP8 entry (the note names the entry offered);
    without it, the epilogue entry stands for the two it includes."""
    store = load_store(SHIPPED_STORE)
    flux = ("flux2-qk-rmsnorm-rope", "flux2-merge-qkv", "flux2-qkv-norm-rope-epilogue", "flux2-norm-modulate",
            "flux2-fp8-swiglu-quant", "flux2-fp8-norm-quant")
    # (flux2-swiglu too, which the FP8 SwiGLU entries do the work of in FP8: the next test)
    assert superseded_by(list(flux), store) == {old: "flux2-fp8-norm-quant" for old in (*flux[:-1], "flux2-swiglu")}
    assert superseded_by(list(flux[:-1]), store) == {"flux2-qk-rmsnorm-rope": "flux2-qkv-norm-rope-epilogue",
                                                     "flux2-merge-qkv": "flux2-qkv-norm-rope-epilogue",
                                                     "flux2-swiglu": "flux2-fp8-swiglu-quant"}


def test_an_fp8_run_does_not_offer_flux2_swiglu_beside_the_fp8_swiglu_entries():
    """Under FP8 the SwiGLU + quantization kernel computes every SwiGLU flux2-swiglu's would (its op never
    runs: a stack with both was rejected not engaged on the CPU, one wasted validation). Offered with
    either FP8 SwiGLU entry, flux2-swiglu is skipped; in a bf16 run, where neither is offered, it stands."""
    store = load_store(SHIPPED_STORE)
    assert superseded_by(["flux2-swiglu", "flux2-fp8-norm-quant"], store)["flux2-swiglu"] == "flux2-fp8-norm-quant"
    assert superseded_by(["flux2-swiglu", "flux2-fp8-swiglu-quant"], store)["flux2-swiglu"] == "flux2-fp8-swiglu-quant"
    bf16 = {e.id for e, _ in match(store, OPPS, "diffusers", "h200", "flux2", precision="bfloat16")}
    assert "flux2-swiglu" in bf16 and not bf16 & {"flux2-fp8-norm-quant", "flux2-fp8-swiglu-quant"}
    assert superseded_by(sorted(bf16), store).get("flux2-swiglu") is None
