"""Verdicts for the knowledge and step tests, made as the validator makes them
(bot/validate/verdict.Verdict): the numbers are test data, the shapes are real."""
from __future__ import annotations

from bot.knowledge.known import patch_sha256
from bot.knowledge.records import ValidationRecord, WorkloadVerdict, load_bench, save_bench
from bot.validate.verdict import Correctness, OutputCheck, Speed, Verdict

ENV = {"device_kind": "cuda", "device_name": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0"}
SHAPE = "1024x1024/txt512/b1"


def gpu_verdict(base_ms=(551.9, 550.2), candidate_ms=(530.6, 532.7), speedup=1.036, status="accepted",
                reason=None, base_sha="b" * 40, candidate_sha="c" * 40, rel_l2=0.003, env=None, **over) -> Verdict:
    """An end-to-end verdict on the full FLUX.2 preset on an H200, eager mode."""
    corr = Correctness(ok=True, seeds=[5, 9, 11], shapes=[SHAPE], rule="rel_l2 <= 0.05",
                       checks=[OutputCheck(f"{SHAPE} seed 5", "noise_pred", True, "", max_abs=0.01, rel_l2=rel_l2)])
    speed = [Speed("eager", "cuda", list(base_ms), list(candidate_ms), speedup, 0.4,
                   "faster" if status == "accepted" else "no-change", n=10, passes=1)]
    kw = dict(status=status, reason=reason, summary=f"correct, engaged, eager {speedup}x", workload="flux2",
              preset="full", device="cuda", dtype="bfloat16", base_sha=base_sha, candidate_sha=candidate_sha,
              candidate=candidate_sha, correctness=corr, speed=speed, env=dict(env or ENV), seconds=150.0)
    kw.update(over)
    return Verdict(**kw)


def record_verdict(entry, verdict=None) -> WorkloadVerdict:
    """The entry's gpu.validation as `store check --device cuda --record` writes it."""
    w = WorkloadVerdict.from_verdict((verdict or gpu_verdict()).to_json())
    w.patch_sha256 = patch_sha256(entry)
    bench = load_bench(entry.path)
    bench.gpu_section().set_validation(ValidationRecord(command="optbot store check --device cuda",
                                                        recorded_at="2026-11-29T22:16:00+00:00", device="cuda",
                                                        workloads={"flux2": w}))
    save_bench(entry.path, bench)
    return w
