"""The SGLang adapter: SGLang's own FLUX.2 and Qwen-Image DiTs, outside its server.

SGLang's diffusion runtime (``sglang.multimodal_gen``) expects a served process around its models.
This module provides exactly the part of that process one forward pass needs, and nothing is
changed in the engine repository (a candidate patches SGLang's real files; the harness only sets up
around them). docs/sglang.md explains each item.

prepare(job), once per process, before the engine is imported:
  - env vars for a one-process "distributed" world: MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>,
    RANK=0, WORLD_SIZE=1, LOCAL_RANK=<device index>;
  - stand-ins for packages the import chain reaches but that cannot be there (runner/engines/
    sglang_standins.py): the compiled ``sgl_kernel`` on CUDA, ``torchvision`` where it is absent
    (a CPU machine: PyPI has no CPU build of it); each is recorded in the environment block;
  - the global server args (``set_global_server_args``: the attention backend (``attention_backend``
    below), kv_gather_degree 1) and the model-parallel groups with tp = sp = 1
    (``maybe_init_distributed_environment_and_model_parallel``; gloo on CPU).
build_model: ``cfg = FluxConfig() | QwenImageDitConfig()``, ``cfg.update_model_arch(hf)``,
  ``out_channels`` set explicitly, ``cls(config=cfg, hf_config=hf)`` (for a quantized precision
  with ``quant_config=`` SGLang's own ModelOpt FP8 config, its weights made as that checkpoint
  format holds them and its input scales calibrated by make_calls: runner/engines/sglang_fp8.py);
  every parameter is then
  created from the seeded state dict in the base (diffusers) format (runner/weights.py), and a
  fused projection (``to_added_qkv`` = add_q/k/v_proj) is built from the seeds of the base names it
  packs, so diffusers and SGLang run on identical weights. On CPU only: the CustomOp layers that
  have a CPU path through ``sgl_kernel``'s CPU kernels run their ``forward_native`` instead, and
  the Triton-only ``fuse_scale_shift_kernel`` falls back to SGLang's own torch version. Last, the
  request-gated fusions a request of SGLang's default quality gets are mounted, as its denoising stage
  mounts them (``mount_quality_fusions``).
make_calls: the workload's (diffusers-convention) inputs become SGLang's: timestep x 1000 (one tensor
  for the passes of a step, as SGLang's pipeline hands every CFG branch the same one), RoPE tables
  (``freqs_cis``) computed once by the model's own rotary module as SGLang's pipeline does before
  its denoising loop, Qwen-Image's all-ones text mask dropped as SGLang's pipeline drops it; each
  forward runs inside ``set_forward_context(current_timestep=0, attn_metadata=None)``.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import socket
from pathlib import Path

import torch

from runner import env as envmod
from runner.engines import sglang_fp8, sglang_standins
from runner.job import split_precision
from runner.weights import build_model as _build_seeded
from runner.weights import seeded_tensor

SDPA = "torch_sdpa"
ATTENTION_NOTE = ("{ran} in place of {prod}, SGLang's own choice on this GPU (its kernels come from the compiled "
                  "sgl_kernel, stood in for here): attention is timed on torch SDPA's kernels, not production's, "
                  "and no speedup of attention measured here is a production one")
# Code that runs here only because of a stand-in, by engine file and function: its line span goes into the
# environment record (`stand_in_code`), and the analyzer reports the opportunities on it without optimizing
# them (bot/analyze/rank.mark_stand_ins): a gain over code production does not run is not a gain.
STAND_IN_CODE = {
    # without FlashInfer, SGLang's RoPE takes its torch fallback inside this function (sglang_standins)
    "flashinfer": ("sglang/multimodal_gen/runtime/layers/rotary_embedding/utils.py", "apply_flashinfer_rope_qk_inplace"),
    # torch SDPA standing in for FlashAttention 3 (FA3_NOTE)
    "attention": ("sglang/multimodal_gen/runtime/layers/attention/backends/sdpa.py", "SDPAImpl.forward"),
}
# Production SGLang on Hopper runs FlashAttention 3 (sglang-kernel 0.4.10, built for the torch 2.14.1 that
# sglang 0.5.23 pins; it cannot load on the GPU box's torch). Its stand-in is torch SDPA with cuDNN's kernel
# first: at these models' shapes (non-causal, head dim 128, ~4.6k tokens) the fastest attention torch has,
# the same class of kernel as FA3. Without it SDPA runs its flash (FA2) kernel, about twice as slow there
# (H200, FLUX.2: 1.58 against 0.81 ms a layer), and every SGLang number carried that ~40-50 ms per step.
FA3_NOTE = ("torch SDPA with cuDNN's kernel first on {n} attention layers, standing in for production's "
            "FlashAttention 3 (sglang-kernel's, built for torch 2.14.1: not loadable here); an attention "
            "change is measured against this stand-in, not against FA3")

# SGLang's DiTs this adapter sets up, by class name: each needs its own arch config and input
# translation (SGLang's pipelines build RoPE tables and scale timesteps before the model).
MODELS = {"Flux2Transformer2DModel": "flux2", "QwenImageTransformer2DModel": "qwen-image"}
CONFIG_CLASSES = {
    "flux2": "sglang.multimodal_gen.configs.models.dits.flux.FluxConfig",
    "qwen-image": "sglang.multimodal_gen.configs.models.dits.qwenimage.QwenImageDitConfig",
}
# The workload's preset config is in diffusers' format; SGLang reads from the hf dict some keys a
# workload may leave to diffusers' constructor defaults. These are those defaults.
HF_DEFAULTS = {
    "flux2": {"eps": 1e-6, "timestep_guidance_channels": 256, "mlp_ratio": 3.0, "rope_theta": 2000,
              "guidance_embeds": True, "patch_size": 1},
    "qwen-image": {"patch_size": 2, "guidance_embeds": False},
}

# The light import set (requirements-sglang.txt) by import name; checked up front so that a
# missing one is one clear line instead of a ModuleNotFoundError deep in SGLang's import chain.
LIGHT_SET = {"tvm_ffi": "apache-tvm-ffi", "cache_dit": "cache-dit", "compressed_tensors": "compressed-tensors",
             "transformers": "transformers", "triton": "triton", "gguf": "gguf", "einops": "einops",
             "addict": "addict", "aiohttp": "aiohttp", "pydantic": "pydantic", "msgspec": "msgspec",
             "orjson": "orjson", "pybase64": "pybase64", "zmq": "pyzmq", "psutil": "psutil",
             "starlette": "starlette", "loguru": "loguru", "dill": "dill", "sentencepiece": "sentencepiece",
             "imageio": "imageio", "IPython": "ipython", "diffusers": "diffusers"}

_prepared: dict = {}


class SGLangSetupError(RuntimeError):
    """SGLang could not be brought up; the message says which step and why."""

    kind = "engine-setup"


def missing_light_set() -> list[str]:
    return sorted(dist for mod, dist in LIGHT_SET.items() if importlib.util.find_spec(mod) is None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _import(dotted: str):
    mod, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def prepare(job) -> None:
    if _prepared:
        return
    missing = missing_light_set()
    if missing:
        raise SGLangSetupError(
            f"the sglang engine needs its light dependency set; missing: {', '.join(missing)}. "
            f"Install it with: pip install -r requirements-sglang.txt (docs/sglang.md)")
    is_cuda = job.device.startswith("cuda")
    index = (torch.device(job.device).index or 0) if is_cuda else 0
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK=str(index))
    if is_cuda:
        torch.cuda.set_device(index)
    notes = sglang_standins.install(is_cuda)
    for k, v in notes.items():
        envmod.note(k, v)

    from sglang.multimodal_gen.runtime.distributed import parallel_state
    from sglang.multimodal_gen.runtime.server_args import server_args as sa

    backend, prod = attention_backend(is_cuda, "sgl_kernel" in notes)
    sa.set_global_server_args(_server_args(sa.ServerArgs, backend))
    parallel_state.maybe_init_distributed_environment_and_model_parallel(tp_size=1, sp_size=1)
    ran = backend or prod  # None: SGLang's own choice, which is production's
    envmod.note("sglang_setup", {"attention_backend": ran, "attention_backend_production": prod,
                                 "tp_size": 1, "sp_size": 1, "distributed_backend": torch.distributed.get_backend()})
    # FA3's stand-in is set on the built model (build_model: cudnn_first, FA3_NOTE); any other gap is noted here
    _prepared["fa3_stand_in"] = ran != prod and prod == "fa"
    if ran != prod and prod != "fa":
        envmod.note("sglang_attention", ATTENTION_NOTE.format(ran=ran, prod=prod))
    standing = [k for k in ("flashinfer",) if k in notes] + (["attention"] if ran != prod else [])
    spans = {k: code_span(job.engine_root, *STAND_IN_CODE[k]) for k in standing}
    if spans:  # a name this engine does not have is said, not guessed
        envmod.note("stand_in_code", {k: [s] if s else [] for k, s in spans.items()})
    _prepared["done"] = True


def code_span(engine_root: str, rel: str, qualname: str) -> str | None:
    """``"rel:first-last"``, the lines of ``qualname`` (``func`` or ``Class.method``) in the engine's
    file, read from its source (a fork may have moved it); None where the file or the name is not there."""
    f = Path(engine_root, rel)
    if not f.is_file():
        return None
    body, node = ast.parse(f.read_text()).body, None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return f"{rel}:{node.lineno}-{node.end_lineno}"


def production_attention(is_cuda: bool) -> str:
    """The attention backend SGLang itself picks for a DiT when its server is started without
    --attention-backend (platforms/cuda.py ``get_attn_backend_cls_str``): FlashAttention 3 ("fa") on
    Hopper and Ampere, cuDNN SDPA with FA behind it on Blackwell, torch SDPA on SM12x and the CPU."""
    if not is_cuda:
        return SDPA
    try:
        from sglang.multimodal_gen.runtime.platforms import current_platform

        name = current_platform._resolve_default_attn_backend().name.lower()
        return "cudnn_sdpa (fa behind it)" if name == "fa" and current_platform.is_blackwell() else name
    except Exception as e:  # a record, never a reason to stop the job
        return f"unknown ({type(e).__name__}: {e})"


def attention_backend(is_cuda: bool, sgl_kernel_stood_in: bool) -> tuple[str | None, str]:
    """(the backend to set, None = SGLang's own choice; the one production runs here).

    With the real sgl_kernel (a team's SGLang install) SGLang chooses, as in production. Where
    sgl_kernel is stood in (the GPU box) its FlashAttention 3 kernels are not there, so attention
    runs on torch SDPA, and the environment says that it is not production's (ATTENTION_NOTE)."""
    prod = production_attention(is_cuda)
    if not is_cuda:
        return SDPA, prod
    return (SDPA if sgl_kernel_stood_in else None), prod


def _server_args(server_args_cls, attention: str | None):
    """A real ServerArgs holding every field's default, without running its __post_init__ (which
    resolves a model path, configures the server's loggers and needs uvicorn): the model reads
    only fields from it."""
    import dataclasses

    args = server_args_cls.__new__(server_args_cls)
    for f in dataclasses.fields(server_args_cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None  # model_path: there is no checkpoint
        object.__setattr__(args, f.name, value)
    args.model_path = "optbot-seeded-weights"
    args.attention_backend = attention
    args.kv_gather_degree = 1
    return args


def build_model(cls, job, preset: dict, dtype):
    if preset.get("weights", "seeded") != "seeded":
        raise SGLangSetupError(
            f"preset {job.preset!r}: weights {preset['weights']!r}: the sglang adapter builds seeded "
            f"weights only (loading a checkpoint goes through SGLang's server loader, not wired here)")
    family = model_key(job)
    hf = dict(HF_DEFAULTS.get(family, {}))
    hf.update(preset["config"])
    hf["out_channels"] = hf.get("out_channels") or hf["in_channels"]
    cfg = _import(CONFIG_CLASSES[family])()
    cfg.update_model_arch(hf)
    # The arch config's __post_init__ resolved out_channels from its own default in_channels before
    # update_model_arch ran: set it again.
    cfg.arch_config.out_channels = hf["out_channels"]

    quant_config = sglang_fp8.config(cls) if split_precision(job.dtype)[1] else None

    def construct(**_):
        if quant_config is None:
            return cls(config=cfg, hf_config=hf)
        return cls(config=cfg, hf_config=hf, quant_config=quant_config)

    model = _build_seeded(construct, {}, job.device, dtype, job.weight_seed, "seeded")
    fused = _seed_packed_params(model, job.weight_seed, job.device, dtype)
    if fused:
        envmod.note("sglang_packed_params", f"{len(fused)} fused params seeded from their base names "
                                            f"(e.g. {fused[0]})")
    if quant_config is not None:
        sglang_fp8.load_weights(model)
    envmod.note("sglang_quality", mount_quality_fusions(model, job.engine_root))
    if not job.device.startswith("cuda"):
        routed = _route_cpu_ops_to_native(model) + (_fp8_cpu_fallbacks() if quant_config is not None else [])
        envmod.note("sglang_cpu_patches", routed)
    elif _prepared.get("fa3_stand_in"):
        envmod.note("sglang_attention", FA3_NOTE.format(n=cudnn_first(model)))
    return model


# SGLang's denoising stage mounts request-gated DiT fusions at every batch for the request's quality
# (`toggle_quality_fusions` over `_QUALITY_FUSION_HANDLERS`: (lowest quality, fusion) pairs), and a request's
# default quality, "lossless", mounts every fusion of that tier: production runs them by default. Outside
# the server nothing mounts them; without this the harness timed the "exact" tier's reference paths
# (on Qwen-Image: the MLP's GELU as its own kernel, the text QKV as three GEMMs; 2026-12-07).
QUALITY_TABLE = ("sglang/multimodal_gen/runtime/pipelines_core/stages/denoising.py", "_QUALITY_FUSION_HANDLERS")


def quality_fusion_table(engine_root: str) -> list[tuple[str, str]] | None:
    """The stage's (tier, fusion name) table, read from its source: importing the stage pulls the whole
    pipeline (torchvision, the schedulers); the table is a literal of names from
    ``sglang.kernels.ops.diffusion``. None where the file or the table is not there (another version)."""
    rel, name = QUALITY_TABLE
    path = Path(engine_root) / rel
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Tuple):
            return [(e.elts[0].value, e.elts[1].id) for e in node.value.elts
                    if isinstance(e, ast.Tuple) and len(e.elts) == 2 and isinstance(e.elts[0], ast.Constant)
                    and isinstance(e.elts[1], ast.Name)]
    return None


def mount_quality_fusions(model, engine_root: str) -> dict:
    """Mount on the built DiT what SGLang's denoising stage mounts for a request of the default quality,
    with SGLang's own fusion objects and guards (each refuses a model whose sites fail them: a quantized
    linear, ...). Returns the environment block's note."""
    import dataclasses

    from sglang.multimodal_gen.configs.sample import sampling_params as sp

    quality = next((f.default for f in dataclasses.fields(sp.SamplingParams) if f.name == "quality"), None)
    if quality is None or not hasattr(sp, "quality_allows"):
        return {"quality": None, "table": "this SGLang has no request quality levels: nothing mounted"}
    table = quality_fusion_table(engine_root)
    if table is None:
        return {"quality": quality, "table": f"not found ({QUALITY_TABLE[0]}: {QUALITY_TABLE[1]}): nothing mounted"}
    ops = importlib.import_module("sglang.kernels.ops.diffusion")
    mounted, refused, other_tier = [], [], []
    for tier, name in table:
        fusion = getattr(ops, name, None)
        if fusion is None or next(fusion.iter_sites(model), None) is None:
            continue  # no site of it on this model
        if not sp.quality_allows(quality, tier):
            fusion.unmount(model)
            other_tier.append(f"{fusion.name} ({tier})")
        elif fusion.mount(model):
            mounted.append(fusion.name)
        else:
            refused.append(fusion.name)
    return {"quality": quality, "mounted": mounted, "refused_by_its_guards": refused,
            "not_at_this_quality": other_tier, "table": ":".join(QUALITY_TABLE)}


def cudnn_first(model) -> int:
    """Every SGLang attention layer of the model (and its torch-SDPA implementation) asks SDPA for
    cuDNN's kernel first: SGLang's own per-layer switch (``allow_cudnn_sdp``, which its platform's
    process-wide ``enable_cudnn_sdp(False)`` leaves to each model). Objects in the child only; the
    engine's files are not touched. Returns how many layers were set."""
    n = 0
    for m in model.modules():
        if not hasattr(m, "allow_cudnn_sdp"):
            continue
        m.allow_cudnn_sdp = True
        kwargs = getattr(m, "_attn_impl_ctor_kwargs", None)
        if isinstance(kwargs, dict):
            kwargs["allow_cudnn_sdp"] = True  # an implementation built later gets it too
        impl = getattr(m, "attn_impl", None)
        if impl is not None and hasattr(impl, "allow_cudnn_sdp"):
            impl.allow_cudnn_sdp = True
        n += 1
    return n


def _seed_packed_params(model, weight_seed: int, device, dtype) -> list[str]:
    """A fused parameter (e.g. ``attn.to_added_qkv.weight``) = its base parameters' seeds
    concatenated on the output dim, using the model's own ``packed_modules_mapping`` (the map
    SGLang's loader uses for real checkpoints)."""
    mapping = getattr(type(model), "packed_modules_mapping", None) or {}
    done = []
    for mod_name, mod in model.named_modules():
        leaf = mod_name.rsplit(".", 1)[-1]
        if leaf not in mapping:
            continue
        parent = mod_name[: -len(leaf)]
        for pname, p in list(mod._parameters.items()):
            if p is None:
                continue
            parts = mapping[leaf]
            if p.shape[0] % len(parts):
                raise SGLangSetupError(f"{mod_name}.{pname}: {tuple(p.shape)} does not split into {parts}")
            rows = p.shape[0] // len(parts)
            pieces = [seeded_tensor(f"{parent}{part}.{pname}", (rows, *p.shape[1:]), weight_seed, device, dtype)
                      for part in parts]
            mod._parameters[pname] = torch.nn.Parameter(torch.cat(pieces, 0), requires_grad=False)
            done.append(f"{mod_name}.{pname}")
    return done


def _route_cpu_ops_to_native(model) -> list[str]:
    """CPU only: SGLang layers whose CPU path calls ``sgl_kernel`` CPU kernels run forward_native,
    and the Triton-only ``fuse_scale_shift_kernel`` uses SGLang's torch fallback."""
    from sglang.multimodal_gen.runtime.layers.custom_op import CustomOp

    routed = set()
    for mod in model.modules():
        if isinstance(mod, CustomOp):
            cls_ = type(mod)
            own_cpu = any("forward_cpu" in c.__dict__ for c in cls_.__mro__ if c is not CustomOp and issubclass(c, CustomOp))
            if own_cpu:
                mod._forward_method = mod.forward_native
                routed.add(f"{cls_.__name__}.forward_cpu -> forward_native")
    from sglang.kernels.ops.diffusion.common.fallback_torch import fuse_scale_shift_kernel_native

    import sys

    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang.multimodal_gen.") and getattr(mod, "fuse_scale_shift_kernel", None) is not None:
            orig = mod.fuse_scale_shift_kernel
            if getattr(orig, "_optbot_cpu_fallback", False):
                continue

            def fallback(x, scale, shift, scale_constant=1.0, block_l=128, block_c=128, _orig=orig):
                if x.is_cuda or getattr(x, "is_xpu", False):
                    return _orig(x, scale, shift, scale_constant, block_l, block_c)
                return fuse_scale_shift_kernel_native(x, scale, shift, scale_constant, block_l, block_c)

            fallback._optbot_cpu_fallback = True
            mod.fuse_scale_shift_kernel = fallback
            routed.add(f"{name}.fuse_scale_shift_kernel -> fuse_scale_shift_kernel_native")
    return sorted(routed)


def quantize(model, recipe: str, job) -> dict:
    """The harness's quantization step for this engine (runner/harness.build): SGLang's own FP8 path,
    already built into the model by build_model (runner/engines/sglang_fp8.py); its input scales
    are calibrated on the first step's inputs (make_calls). Returns the environment block's note."""
    from runner.quant import QuantError

    if recipe != "fp8":
        raise QuantError(f"the sglang engine deploys only the fp8 recipe (its own ModelOpt FP8), not {recipe!r}")
    layers = sglang_fp8.fp8_layers(model)
    if not layers:
        raise QuantError(f"{type(model).__name__} was built with SGLang's ModelOpt FP8 config but no layer took "
                         "its FP8 method: nothing is quantized")
    plain = sorted(n for n, m in model.named_modules()
                   if n and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2
                   and m.weight.dtype != torch.float8_e4m3fn and "embed" not in type(m).__name__.lower())
    return {"recipe": recipe, "implementation": sglang_fp8.IMPLEMENTATION,
            "form": "e4m3 weights, one scale per checkpoint tensor; e4m3 inputs, one static scale per tensor; "
                    "attention unchanged",
            "linear_layers": len(layers),
            "left_unquantized": plain[:20] + (["..."] if len(plain) > 20 else []),
            "left_unquantized_why": "SGLang builds these without its quantization config (a ModelOpt FP8 "
                                    "checkpoint keeps them in bfloat16)"}


def _fp8_cpu_fallbacks() -> list[str]:
    """CPU only, FP8: SGLang's per-tensor FP8 quantization has no CPU kernel (its Triton
    `static_quant_fp8` needs a GPU driver; `sgl_per_tensor_quant_fp8`, used at load time, is imported on
    CUDA only): torch versions of the same arithmetic (runner/quant.to_e4m3)."""
    import sglang.kernels.ops.quantization.fp8_kernel as fk
    import sglang.srt.layers.quantization.fp8_utils as fu

    from runner.quant import E4M3_MAX, to_e4m3

    orig = fu.static_quant_fp8
    if getattr(orig, "_optbot_cpu_fallback", False):  # a second model in this process
        return list(CPU_FP8_PATCHES)

    def per_tensor(input, output, scale, is_static=False):
        if not is_static:
            scale.copy_((input.abs().amax().float() / E4M3_MAX).clamp(min=1e-12).reshape(scale.shape))
        output.copy_(to_e4m3(input, scale).to(output.dtype))

    def static_quant(x, x_s, repeat_scale=False):
        if x.is_cuda:
            return orig(x, x_s, repeat_scale)
        return to_e4m3(x, x_s), (x_s.reshape(1, 1).expand(x.numel() // x.shape[-1], 1).contiguous() if repeat_scale else x_s)

    static_quant._optbot_cpu_fallback = True
    fk.sgl_per_tensor_quant_fp8 = per_tensor
    fu.static_quant_fp8 = static_quant
    fu.torch = _RowwiseScaledMmOnCpu()
    return list(CPU_FP8_PATCHES)


CPU_FP8_PATCHES = ("fp8_kernel.sgl_per_tensor_quant_fp8 -> torch", "fp8_utils.static_quant_fp8 -> torch (CPU tensors)",
                   "fp8_utils: torch._scaled_mm's per-tensor scales given as rows (CPU tensors)")


class _RowwiseScaledMmOnCpu:
    """torch, for SGLang's fp8_utils on the CPU: `_scaled_mm` with two per-tensor scales (ModelOpt FP8's
    product) gets them as the same scale on every row and column, the identical product, because
    torch's CPU `_scaled_mm` takes about 1,000x longer with per-tensor scales than row-wise (2.4 s
    against 2 ms for 288 x 256 x 768 on a 2-core CPU, torch 2.13, 2026-12-06), which made a tiny FLUX.2 step 13 s."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def _scaled_mm(a, b, *args, scale_a=None, scale_b=None, **kw):
        if (not args and not a.is_cuda and scale_a is not None and scale_b is not None
                and scale_a.numel() == 1 and scale_b.numel() == 1):
            scale_a = scale_a.float().reshape(1, 1).expand(a.shape[0], 1).contiguous()
            scale_b = scale_b.float().reshape(1, 1).expand(1, b.shape[1]).contiguous()
        return torch._scaled_mm(a, b, *args, scale_a=scale_a, scale_b=scale_b, **kw)


# --------------------------------------------------------------------------------------------
# inputs: the workload's kwargs (diffusers convention) -> SGLang's forward


def model_key(job) -> str:
    name = job.model_class.rpartition(".")[2]
    if name not in MODELS:
        raise SGLangSetupError(f"the sglang adapter sets up {', '.join(MODELS)}, not {name} "
                               f"(runner/engines/sglang.py: its arch config and input translation)")
    return MODELS[name]


def make_calls(model, passes: list[dict], job) -> list:
    from sglang.multimodal_gen.runtime.managers.forward_context import set_forward_context

    family = model_key(job)
    # SGLang's denoising stage expands the step's timestep once and hands that one tensor to every
    # CFG branch (denoising.py, _predict_noise_with_cfg); its Qwen-Image reuses the first branch's
    # block modulation for the second by the timestep's identity (_QwenModulationCacheKey). So the
    # passes that share a timestep here share its scaled tensor too: one per source tensor.
    scaled: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def timestep(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in scaled:
            scaled[id(t)] = (t, t * 1000)  # SGLang takes the scheduler's timestep (diffusers scales inside)
        return scaled[id(t)][1]

    def one(kw: dict):
        sk = (_flux2_kwargs if family == "flux2" else _qwen_image_kwargs)(model, kw, timestep(kw["timestep"]))

        def call():
            with set_forward_context(current_timestep=0, attn_metadata=None):
                out = model(**sk)
            return out[0] if isinstance(out, (tuple, list)) else getattr(out, "sample", out)

        return call

    calls = [one(kw) for kw in passes]
    if getattr(model, "optbot_fp8_calibrated", True) is False:  # once per model, as a checkpoint's scales are
        cal = sglang_fp8.calibrate(model, lambda: [c() for c in calls])
        envmod.note("quant", {**(envmod.noted("quant") or {}), "calibration": cal})  # one note per FP8 row
    return calls


def _flux2_kwargs(model, kw: dict, timestep: torch.Tensor) -> dict:
    # RoPE as SGLang's Flux2 pipeline builds it: text positions first, then image, as (cos, sin).
    txt_cos, txt_sin = model.rotary_emb(kw["txt_ids"])
    img_cos, img_sin = model.rotary_emb(kw["img_ids"])
    device = kw["hidden_states"].device
    out = dict(
        hidden_states=kw["hidden_states"],
        encoder_hidden_states=kw["encoder_hidden_states"],
        timestep=timestep,
        freqs_cis=(torch.cat([txt_cos, img_cos], 0).to(device), torch.cat([txt_sin, img_sin], 0).to(device)),
    )
    if kw.get("guidance") is not None:
        out["guidance"] = kw["guidance"]  # both scale guidance by 1000 inside forward
    return out


def _qwen_image_kwargs(model, kw: dict, timestep: torch.Tensor) -> dict:
    hs, ehs = kw["hidden_states"], kw["encoder_hidden_states"]
    b, t = ehs.shape[0], ehs.shape[1]
    img_shapes = [[tuple(s) for s in ([kw["img_shapes"][i]] if isinstance(kw["img_shapes"][i], tuple)
                                      else kw["img_shapes"][i])] for i in range(b)]
    txt_seq_lens = [t] * b
    mask = kw.get("encoder_hidden_states_mask")
    if mask is not None:
        lens = mask.to(torch.bool).sum(dim=1).tolist()
        if all(n == t for n in lens):
            mask = None  # SGLang's pipeline passes no mask when every prompt fills the text length
        else:
            txt_seq_lens = [int(n) for n in lens]
            mask = mask.to(torch.bool)
    # RoPE tables as SGLang's QwenImage pipeline config builds them (get_freqs_cis).
    img_freqs, txt_freqs = model.rotary_emb(img_shapes, txt_seq_lens, device=hs.device)
    img_cache = torch.cat([img_freqs.real.float(), img_freqs.imag.float()], dim=-1).contiguous()
    txt_cache = torch.cat([txt_freqs.real.float(), txt_freqs.imag.float()], dim=-1).contiguous()
    return dict(
        hidden_states=hs,
        encoder_hidden_states=ehs,
        encoder_hidden_states_mask=mask,
        timestep=timestep,  # SGLang divides by 1000 inside; diffusers takes t in [0, 1]
        img_shapes=img_shapes,
        txt_seq_lens=txt_seq_lens,
        freqs_cis=(img_cache, txt_cache),
        freqs_complex=(img_freqs, txt_freqs),
    )
