"""benchmarks/chart.py: the README's charts are drawn from `optbot bench` JSON, nothing computed but
the layout. A --quant bench (SGLang's FP8 FLUX.2 on an H100, committed) shows the FP8 floor that binds
it and names its bar, which is no compile row there (upstream FP8 does not compile)."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "results" / "h100-sglang-fp8-static-quant-20261206" / "bench-flux2-sglang.json"


def test_a_quantized_bench_chart_shows_its_fp8_floor_and_its_bar(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.chart import main, panel

    bench = json.loads(BENCH.read_text())
    fig, ax = plt.subplots()
    panel(ax, bench)
    texts = [t.get_text() for t in ax.texts]
    assert "compute floor, FP8 linear 258" in texts and "compute floor 386" in texts, texts
    assert "the bar (upstream+fp8 graph) 314" in texts, texts
    assert "282" in texts and "(candidates at fp8)" in ax.get_title()
    assert sum("InductorError" in t for t in texts) == 2  # upstream FP8's compiled rows, drawn as failed
    plt.close(fig)
    out = tmp_path / "c.png"
    main(str(out), [str(BENCH)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
