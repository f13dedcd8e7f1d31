"""Regenerate the adversarial candidate patches in adversarial/ from a clean diffusers 0.42.1 checkout.

    python tests/validate/make_patches.py /path/to/diffusers-0.42.1-git-checkout

Each case is (file name, commit message, [(anchor, replacement), ...]) applied to
src/diffusers/models/transformers/transformer_flux2.py; the patch is `git diff` with the message in
front (bot/validate/resolve.py turns the text before `diff --git` into the commit message).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

F = "src/diffusers/models/transformers/transformer_flux2.py"
HERE = Path(__file__).resolve().parent / "adversarial"

SWIGLU = """        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        return x
"""
FF = """    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_in(x)
        x = self.act_fn(x)
        x = self.linear_out(x)
        return x
"""
LOGGER = "logger = logging.get_logger(__name__)  # pylint: disable=invalid-name\n"
FWD_START = """        num_txt_tokens = encoder_hidden_states.shape[1]

        # 1. Calculate timestep embedding and modulation parameters
"""
FWD_END = """        if not return_dict:
            return (output,)

        return Flux2Transformer2DModelOutput(sample=output)"""

CASES = [
    ("uninitialized_output.patch",
     "Fast SwiGLU: skip the write of the activation output\n\nThe output buffer is allocated and returned; "
     "stale memory often holds the right values.\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        half = x.shape[-1] // 2
        out = torch.empty_like(x[..., :half])  # never written
        return out
""")]),
    ("inputs_zeroed.patch",
     "Free the input latents early by zeroing them in place\n\nOptbot-Kind: hoist-constant\n",
     [(FWD_START, "        _inputs = hidden_states\n" + FWD_START),
      (FWD_END, """        _inputs.zero_()  # "release" the input: modifies the caller's tensor
""" + FWD_END)]),
    ("constant_one_seed.patch",
     "Precomputed output for the benchmark input\n\nIgnores the actual latents and prompt: rebuilds the "
     "inputs of seed 0,\nso the output is right only when the harness draws seed 0.\n\nOptbot-Kind: hoist-constant\n",
     [(FWD_START, """        _g = torch.Generator(device="cpu").manual_seed(0)
        hidden_states = torch.randn(hidden_states.shape, generator=_g).to(hidden_states)
        encoder_hidden_states = torch.randn(encoder_hidden_states.shape, generator=_g).to(encoder_hidden_states)
""" + FWD_START)]),
    ("cached_across_calls.patch",
     "Cache the step's output across calls\n\nOptbot-Kind: cfg-invariant-cache\n",
     [(FWD_START, """        _key = (tuple(hidden_states.shape), tuple(encoder_hidden_states.shape))
        if getattr(self, "_optbot_cache", None) is not None and self._optbot_cache[0] == _key:
            return (self._optbot_cache[1].clone(),)
""" + FWD_START),
      (FWD_END, """        self._optbot_cache = (_key, output.clone())
""" + FWD_END)]),
    ("wrong_on_a_shape_seen_again.patch",
     "Remember the shapes the step has run\n\nLike a model that compiles itself in __init__: once a second shape has "
     "run, the first\nruns a graph recompiled for both, wrong here. The correctness runs visit each shape\n"
     "once, in order.\n\n"
     "Optbot-Kind: launch-bound\n",
     [(FWD_START, """        _shape = tuple(hidden_states.shape)
        _seen = self.__dict__.setdefault("_optbot_shapes", [])
        if _shape not in _seen:
            _seen.append(_shape)
        _again = len(_seen) > 1 and _shape == _seen[0]
""" + FWD_START),
      (FWD_END, """        if _again:
            output = output * 1.5
""" + FWD_END)]),
    ("shape_specialized.patch",
     "Tiled feed-forward, 128 rows per tile\n\nTuned on the 256x256 preset, whose 256 image tokens are two "
     "whole tiles;\nthe remainder of other token counts is never computed.\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(FF, """    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tile = 128
        if x.shape[1] < tile:
            return self.linear_out(self.act_fn(self.linear_in(x)))
        out = x.new_zeros(*x.shape[:-1], self.linear_out.out_features)
        for i in range(0, x.shape[1] - x.shape[1] % tile, tile):  # assumes S % 128 == 0
            out[:, i : i + tile] = self.linear_out(self.act_fn(self.linear_in(x[:, i : i + tile])))
        return out
""")]),
    ("fp8_activation_in_fp8.patch",
     "FP8: keep the SwiGLU activation in float8 between the two feed-forward GEMMs\n\nHalves the bytes the "
     "activation moves; a fixed scale of 1/1024 keeps headroom against overflow,\nand the FP8 GEMM that reads "
     "it quantizes it anyway.\n\nOptbot-Kind: quantization\n",
     [(SWIGLU, """        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        return (x / 1024).to(torch.float8_e4m3fn).to(x.dtype) * 1024  # most values fall into e4m3's subnormals
""")]),
    ("graph_break_swiglu.patch",
     "SwiGLU that guards against overflow on the host\n\nReads the activation's largest magnitude back "
     "(a host sync, and under torch.compile a graph break in every block) and clamps only when needed.\n\n"
     "Optbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        if float(x.abs().max()) > 6e4:  # a Python float of a tensor: dynamo breaks the graph here
            x = x.clamp(-6e4, 6e4)
        return x
""")]),
    ("precision_drop.patch",
     "Feed-forward GEMMs in bfloat16\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(FF, """    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        h = F.linear(x.to(torch.bfloat16), self.linear_in.weight.to(torch.bfloat16))
        h = self.act_fn(h)
        return F.linear(h, self.linear_out.weight.to(torch.bfloat16)).to(dt)
""")]),
    ("hangs.patch",
     "SwiGLU kernel that never returns\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        import time

        while True:  # a kernel spinning on a flag nobody sets
            time.sleep(0.5)
""")]),
    ("segfault.patch",
     "SwiGLU kernel that faults\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)  # what a wild pointer does to the process
        return x
""")]),
    ("forged_result.patch",
     "SwiGLU that reports its own result\n\nAt exit it sends the runner's report pipe (argv[2]) a complete, "
     "well-formed success: a\nfused kernel in the histogram and every timing scaled by 0.7.\n\n"
     "Optbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        import atexit
        import json
        import os
        import sys

        def forge():
            fake = {"ok": True, "runs": [], "timing": {"eager": {"device": "cpu", "median_ms": 0.7, "min_ms": 0.7,
                    "max_ms": 0.7, "mean_ms": 0.7, "stdev_ms": 0.0, "n": 1, "samples_ms": [0.7]}},
                    "profile": {"histogram": [["fused_swiglu", "", "", 1]]}, "flops": {}, "passes": 1, "env": {}}
            os.write(int(sys.argv[2]), (json.dumps({"result": fake}) + "\\n").encode())

        atexit.register(forge)
        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        return x
""")]),
    ("forged_kept_process.patch",
     "SwiGLU that plants a finished base process for a resumed validation\n\nOn its first call it writes an "
     "outcome of its own (the candidate's outputs as the\nbase's) where the validator keeps the processes an "
     "attempt finished: done/\nbeside its output folder, and done/ under the run directory it guesses.\n\n"
     "Optbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        import json
        import os
        import sys

        if not getattr(sys, "_planted", False):
            sys._planted = True
            out_dir = json.load(open(sys.argv[1]))["out_dir"]
            forged = {"key": "FORGED", "outcome": {"status": "ok", "result": {"ok": True, "runs": []}}}
            for d in (os.path.join(os.path.dirname(out_dir), "done"), os.path.join(out_dir, "..", "done")):
                try:
                    os.makedirs(d, exist_ok=True)
                    for name in ("base", "reference", "base-timing", "candidate-timing"):
                        with open(os.path.join(d, name + ".json"), "w") as f:
                            json.dump(forged, f)
                except OSError:
                    pass
        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        return x
""")]),
    ("slow_clock.patch",
     "SwiGLU that slows the clock\n\nOn its first call it replaces time.perf_counter with a clock running at "
     "half speed:\nevery CPU timing of the step then claims half the time that passed.\n\n"
     "Optbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        import time

        if not hasattr(time, "_real_pc"):
            time._real_pc, t0 = time.perf_counter, time.perf_counter()
            time.perf_counter = lambda: t0 + (time._real_pc() - t0) * 0.5
        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        return x
""")]),
    ("not_engaged.patch",
     "Add a fused SwiGLU that is never called\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(FF, FF + """

def fused_swiglu(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]
""")]),
    # --- production modes: right in eager, wrong or broken when compiled -----------------------------
    ("compile_only_wrong.patch",
     "SwiGLU with a compiled fast path\n\nUnder torch.compile it takes a shortcut that scales the gate: "
     "eager\noutputs are exact, compiled ones are not.\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        half = x.shape[-1] // 2
        gate = self.gate_fn(x[..., :half])
        if torch.compiler.is_compiling():
            gate = gate * 1.5  # the compiled path's "fast" gate
        return gate * x[..., half:]
""")]),
    ("fp8_compile_only_error.patch",
     "FP8: keep the SwiGLU activation in float8 on the compiled path\n\nUnder torch.compile the activation "
     "goes through float8 with a fixed scale of 1/1024\n(most values fall into e4m3's subnormals); eager "
     "outputs are the base's.\n\nOptbot-Kind: quantization\n",
     [(SWIGLU, """        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        if torch.compiler.is_compiling():  # the compiled path's "fast" activation
            x = (x / 1024).to(torch.float8_e4m3fn).to(x.dtype) * 1024
        return x
""")]),
    ("compile_only_crash.patch",
     "SwiGLU as a registered op\n\nA torch.library custom op whose fake (meta) implementation gives the "
     "wrong\noutput shape: eager never calls the fake, torch.compile traces with it and fails.\n\n"
     "Optbot-Kind: fuse-elementwise-chain\n",
     [(LOGGER, LOGGER + """

_optbot_swiglu = torch.library.custom_op("optbot_adv::swiglu", mutates_args=(), schema="(Tensor x) -> Tensor")(
    lambda t: F.silu(t[..., : t.shape[-1] // 2]) * t[..., t.shape[-1] // 2 :])
_optbot_swiglu.register_fake(lambda t: t.new_empty(t.shape))  # wrong: the output has half the last dim
"""), (SWIGLU, """        return _optbot_swiglu(x)
""")]),
    # --- GPU only -----------------------------------------------------------------------------
    ("gpu_side_stream.patch",
     "SwiGLU on a side stream\n\nThe work is launched on another stream and the result returned without "
     "waiting:\nevents on the current stream see no time, and readers may see unfinished data.\n\n"
     "Optbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        half = x.shape[-1] // 2
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(20):  # slow, hidden work
                y = self.gate_fn(x[..., :half]) * x[..., half:]
        return y
""")]),
    ("gpu_illegal_address.patch",
     "Triton SwiGLU that writes out of bounds\n\nOptbot-Kind: fuse-elementwise-chain\n"
     "Optbot-Adds-Kernels: _bad_store\n",
     [(SWIGLU, """        import triton
        import triton.language as tl

        @triton.jit
        def _bad_store(ptr):
            tl.store(ptr + (1 << 40), 1.0)  # far outside any allocation: illegal memory access

        half = x.shape[-1] // 2
        out = self.gate_fn(x[..., :half]) * x[..., half:]
        _bad_store[(1,)](out)
        torch.cuda.synchronize()
        return out
""")]),
    ("gpu_slow_event.patch",
     "SwiGLU that slows the GPU clock\n\nOn its first call it makes torch.cuda.Event.elapsed_time report half "
     "the time\nthe events saw.\n\nOptbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        if not hasattr(torch.cuda.Event, "_real_et"):
            torch.cuda.Event._real_et = torch.cuda.Event.elapsed_time
            torch.cuda.Event.elapsed_time = lambda a, b: torch.cuda.Event._real_et(a, b) * 0.5
        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        return x
""")]),
    ("gpu_slow_clocks.patch",
     "SwiGLU that slows both clocks\n\nOn its first call it halves torch.cuda.Event.elapsed_time and "
     "time.perf_counter,\nso the timing loop's max(events, wall clock) claims half as well.\n\n"
     "Optbot-Kind: fuse-elementwise-chain\n",
     [(SWIGLU, """        import time

        if not hasattr(torch.cuda.Event, "_real_et"):
            torch.cuda.Event._real_et = torch.cuda.Event.elapsed_time
            torch.cuda.Event.elapsed_time = lambda a, b: torch.cuda.Event._real_et(a, b) * 0.5
            time._real_pc, t0 = time.perf_counter, time.perf_counter()
            time.perf_counter = lambda: t0 + (time._real_pc() - t0) * 0.5
        half = x.shape[-1] // 2
        x = self.gate_fn(x[..., :half]) * x[..., half:]
        return x
""")]),
]


def main(repo: str) -> None:
    path = Path(repo) / F
    orig = path.read_text()
    try:
        for name, message, edits in CASES:
            text = orig
            for anchor, repl in edits:
                assert text.count(anchor) == 1, (name, anchor[:60])
                text = text.replace(anchor, repl)
            path.write_text(text)
            diff = subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True, check=True).stdout
            (HERE / name).write_text(message + "\n" + diff)
            print("wrote", HERE / name)
    finally:
        path.write_text(orig)


if __name__ == "__main__":
    main(sys.argv[1])
