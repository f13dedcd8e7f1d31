"""Stand-ins for packages SGLang's import chain reaches but that cannot be installed where optbot runs.

Only the SGLang adapter installs them, only in the runner child process, only when the real package
is absent, and every one it installs is reported in the result's environment block. Nothing here
is written into the engine repository.

``sgl_kernel`` (CUDA only). SGLang's compiled kernel package: its wheels pin a CUDA torch and are
not on the GPU box. On CUDA, modules of the DiT import chain import names from it at import time
(e.g. ``layernorm.py``: ``from sgl_kernel import fused_add_rmsnorm, rmsnorm``). The stand-in
provides ``rmsnorm`` and ``fused_add_rmsnorm`` in torch (float32 accumulation, the kernels'
semantics: ``fused_add_rmsnorm`` adds in place into ``residual`` and normalizes in place into
``input``). Any other name resolves to a placeholder that raises NotImplementedError naming itself
when called, so a code path that really needs a compiled kernel stops with the exact blocker
instead of computing something else.

``torchvision`` (where it is absent: PyPI has no CPU build matching a CPU torch). Some modules of
the chain (InternVL/DeepSeek-OCR image preprocessing, unrelated to the DiTs) import it at import
time. The stand-in only satisfies those imports; calling anything in it raises. Before installing
it, transformers' and diffusers' cached "is torchvision available" answers are taken (False), so
they never try to use it.

``flashinfer`` is not stood in for, only reported: sglang 0.5.23 requires it, but its wheel (65 MB,
with CuTe-DSL and cuda-python behind it) is not on the GPU box, and some sixty SGLang modules import
it behind ``try``, so a stand-in package would turn their working fallbacks into errors. Without
it SGLang's RoPE takes its own torch fallback (``apply_flashinfer_rope_qk_inplace`` in
rotary_embedding/utils.py: about a dozen elementwise ops per q/k pair) where a production install
runs FlashInfer's one in-place kernel. The note says so, so that no result passes that path off as
SGLang's production speed (docs/sglang.md).

Attention is the fourth thing that differs from production, and not a package stand-in: SGLang's
FlashAttention 3 comes from the compiled sgl_kernel, so where that is stood in the adapter runs
torch SDPA with cuDNN's kernel first in its place (runner/engines/sglang.py, ``FA3_NOTE``).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import torch

SGL_KERNEL_NOTE = ("optbot stand-in (torch rmsnorm, fused_add_rmsnorm; fp8_scaled_mm as torch._scaled_mm with "
                   "row-wise scales, cuBLASLt's FP8 GEMM where production runs sgl_kernel's CUTLASS one; "
                   "any other kernel raises)")
TORCHVISION_NOTE = "optbot import-only stand-in (torchvision absent; calls raise)"
FLASHINFER_NOTE = ("absent, no stand-in: SGLang's RoPE runs its own torch fallback (about a dozen ops per q/k "
                   "pair) where production runs FlashInfer's in-place kernel")


class _Missing:
    """A placeholder for a name of a missing package: importable, attribute-able, never callable."""

    def __init__(self, name: str, why: str):
        self._name, self._why = name, why

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is not available: {self._why}")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}", self._why)

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self) -> str:
        return f"<optbot stand-in {self._name}>"


class _StandinPackage(types.ModuleType):
    def __init__(self, name: str, why: str, defined: dict | None = None):
        super().__init__(name)
        self.__dict__.update(defined or {})
        self.__path__ = []  # a package: submodules come from the finder below
        self.__spec__ = importlib.machinery.ModuleSpec(name, _FINDERS[name.split(".")[0]], is_package=True)
        self.__file__ = None
        self._optbot_why = why

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}", self._optbot_why)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``root.<anything>`` submodules as stand-in packages."""

    def __init__(self, root: str, why: str):
        self.root, self.why = root, why

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandinPackage(spec.name, self.why)

    def exec_module(self, module):
        pass


_FINDERS: dict[str, _Finder] = {}


def _install_package(root: str, why: str, defined: dict) -> None:
    finder = _Finder(root, why)
    _FINDERS[root] = finder
    sys.meta_path.append(finder)  # last: a real package, if any, is found first
    sys.modules[root] = _StandinPackage(root, why, defined)


# --------------------------------------------------------------------------------------------
# sgl_kernel


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in float32."""
    x = input.float()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(input.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: bool | None = None) -> None:
    """residual += input; input = rmsnorm(residual) * weight (both in place, as the kernel does)."""
    residual.add_(input)
    input.copy_(rmsnorm(residual, weight, eps))


def fp8_scaled_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, scales_a: torch.Tensor, scales_b: torch.Tensor,
                  out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """e4m3 A [M, K] times e4m3 B [K, N] (column-major), A scaled per row (or one scalar, broadcast:
    SGLang's ModelOpt FP8 passes its static per-tensor input scale), B per column; out_dtype out.
    The kernel's contract (sgl_kernel's CUTLASS sm90 GEMM, called by SGLang's FP8 linear on Hopper)
    on torch._scaled_mm, which takes row-wise scales only as [M, 1] and [1, N]; fast accumulation as
    SGLang's own torch path sets it."""
    m, n = mat_a.shape[0], mat_b.shape[1]
    sa = scales_a.float().reshape(-1)
    sa = (sa.expand(m) if sa.numel() == 1 else sa).reshape(m, 1).contiguous()
    sb = scales_b.float().reshape(1, n).contiguous()
    return torch._scaled_mm(mat_a, mat_b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, bias=bias,
                            use_fast_accum=mat_a.is_cuda)


def install_sgl_kernel() -> None:
    _install_package("sgl_kernel", "the compiled sgl_kernel package is absent; optbot's stand-in "
                     "provides only rmsnorm, fused_add_rmsnorm and fp8_scaled_mm",
                     {"rmsnorm": rmsnorm, "fused_add_rmsnorm": fused_add_rmsnorm, "fp8_scaled_mm": fp8_scaled_mm,
                      "__version__": "0.0.0+optbot.standin"})


# --------------------------------------------------------------------------------------------
# torchvision


def install_torchvision() -> None:
    # Take the libraries' answers while torchvision is really absent, so they stay False.
    try:
        import transformers.utils.import_utils as tiu

        for fn in ("is_torchvision_available", "is_torchvision_v2_available"):
            if hasattr(tiu, fn):
                getattr(tiu, fn)()
    except ImportError:
        pass
    try:
        import diffusers.utils.import_utils  # noqa: F401  (computes its availability flags at import)
    except ImportError:
        pass
    _install_package("torchvision", "torchvision is not installed (optbot import-only stand-in)", {})


def install(is_cuda: bool) -> dict[str, str]:
    """Install what this machine lacks; return the notes for the environment block."""
    notes = {}
    if is_cuda and importlib.util.find_spec("sgl_kernel") is None:
        install_sgl_kernel()
        notes["sgl_kernel"] = SGL_KERNEL_NOTE
    if importlib.util.find_spec("torchvision") is None:
        install_torchvision()
        notes["torchvision"] = TORCHVISION_NOTE
    if is_cuda and importlib.util.find_spec("flashinfer") is None:
        notes["flashinfer"] = FLASHINFER_NOTE  # reported only: nothing is installed for it
    return notes
