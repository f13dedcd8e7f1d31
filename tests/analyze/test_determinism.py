"""The same graph and profile rank the same, whatever the process: string hashing (PYTHONHASHSEED)
and the values of value numbers (hashes, compared only for equality) must not reach the ranking."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from tests.analyze.toy_helpers import HERE
from toy_models import Contraption, inputs

ROOT = HERE.parent.parent
# what the ranking is: the order of the ids, with the gains, confidences and places
_RANKED = """
import json, sys
from bot.analyze.graph import Graph
from bot.analyze.run import analyze
a = analyze(Graph.load(sys.argv[1]), json.load(open(sys.argv[2])), {}, "test")
print(json.dumps([[o["id"], o["gain_ms"], o["confidence"], o["op_ids"], o["location"]["examples"]]
                  for o in a["opportunities"]]))
"""


def _ranked(a) -> list:
    return [[o["id"], o["gain_ms"], o["confidence"], o["op_ids"], o["location"]["examples"]]
            for o in a["opportunities"]]


def test_ranking_is_the_same_under_other_hash_seeds(toy, tmp_path):
    torch.manual_seed(0)
    a, _ = toy(Contraption(), [inputs(0), inputs(0, prompt_seed=7)])
    assert len(a["opportunities"]) >= 5  # several kinds, so the order means something
    runs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        res = subprocess.run([sys.executable, "-c", _RANKED, str(tmp_path / "graph.json"), str(tmp_path / "profile.json")],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert res.returncode == 0, res.stderr
        runs.append(json.loads(res.stdout))
    assert runs[0] == runs[1]
    assert runs[0] == _ranked(a)  # and the same as in this process


def test_ranking_does_not_depend_on_the_numbers_chosen_as_value_numbers(toy, tmp_path):
    """Renumber every value number by another one-to-one map: equal stays equal, so nothing may change."""
    from bot.analyze.graph import Graph
    from bot.analyze.run import analyze

    torch.manual_seed(0)
    a, g = toy(Contraption(), [inputs(0), inputs(0, prompt_seed=7)])
    raw = json.loads(json.dumps(g.raw))
    fresh: dict[int, int] = {}
    for v in raw["values"]:
        v["vn"] = fresh.setdefault(v["vn"], (len(fresh) * 7919 + 13) % (1 << 61))
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert _ranked(analyze(Graph.from_json(raw), profile, {}, "test")) == _ranked(a)
