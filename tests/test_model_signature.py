"""bot/model_signature.py: a model class's forward/__init__ parameters read from source, and the
workload check built on them. Against the pinned diffusers engine (the session's diffusers_engine)
and on small synthetic engines, whose classes are also run by Python as the ground truth."""
from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
import yaml

from bot import model_signature
from bot.errors import ConfigError
from bot.model_signature import check_inputs, read_signature

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMERS = "diffusers.models.transformers"
FLUX2 = f"{TRANSFORMERS}.transformer_flux2.Flux2Transformer2DModel"
FLUX2_FILE = "src/diffusers/models/transformers/transformer_flux2.py"


@pytest.fixture
def diffusers(diffusers_engine):
    # the session's engine repository (tests/conftest.py), not a path guessed in the test home: under
    # pytest-xdist a worker's home holds it only once a test of that worker has materialized it
    return diffusers_engine.repo_path


def line_of(root: Path, file: str, line: int) -> str:
    return (root / file).read_text().splitlines()[line - 1]


# -- the real engine ---------------------------------------------------------------------------------

def test_flux2_signature(diffusers):
    sig = read_signature(diffusers, "src", FLUX2)
    assert (sig.name, sig.file) == ("Flux2Transformer2DModel", FLUX2_FILE)
    assert line_of(diffusers, sig.file, sig.line).startswith("class Flux2Transformer2DModel(")
    f = sig.forward
    assert f.params[:6] == ("hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids", "guidance")
    assert f.required == ("hidden_states",) and not f.var_keyword and not f.var_positional
    assert (f.file, f.owner) == (FLUX2_FILE, "Flux2Transformer2DModel")
    assert line_of(diffusers, f.file, f.line) == "    def forward("
    # __init__ is under @register_to_config: the decorator does not hide its parameters
    assert {"num_single_layers", "joint_attention_dim", "axes_dims_rope", "guidance_embeds"} <= set(sig.init.params)
    assert sig.init.required == () and line_of(diffusers, sig.init.file, sig.init.line) == "    def __init__("


@pytest.mark.parametrize("module, cls, has, required", [
    ("transformer_qwenimage", "QwenImageTransformer2DModel", {"img_shapes", "encoder_hidden_states_mask"},
     ("hidden_states",)),
    ("transformer_wan", "WanTransformer3DModel", {"encoder_hidden_states_image"},
     ("hidden_states", "timestep", "encoder_hidden_states")),
    ("transformer_sd3", "SD3Transformer2DModel", {"pooled_projections", "skip_layers"}, ("hidden_states",)),
    ("transformer_lumina2", "Lumina2Transformer2DModel", {"encoder_attention_mask"},
     ("hidden_states", "timestep", "encoder_hidden_states", "encoder_attention_mask")),
])
def test_real_signatures(diffusers, module, cls, has, required):
    sig = read_signature(diffusers, "src", f"{TRANSFORMERS}.{module}.{cls}")
    assert sig.name == cls and sig.file == f"src/diffusers/models/transformers/{module}.py"
    assert has <= set(sig.forward.params) and sig.forward.required == required
    assert sig.init.params and sig.init.required == ()


def test_reexported_name_resolves_to_the_defining_file(diffusers):
    # diffusers/__init__.py binds its classes under `if TYPE_CHECKING or DIFFUSERS_SLOW_IMPORT:`
    for path in ("diffusers.Flux2Transformer2DModel", "diffusers.models.Flux2Transformer2DModel"):
        sig = read_signature(diffusers, "src", path)
        assert (sig.file, sig.forward.params) == (FLUX2_FILE, read_signature(diffusers, "src", FLUX2).forward.params)


def test_every_transformer_model_reads(diffusers):
    """No error and no wrong reading anywhere in models/transformers: where the class body defines
    forward, that def is what is read."""
    folder = diffusers / "src" / "diffusers" / "models" / "transformers"
    checked = 0
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Model"):
                sig = read_signature(diffusers, "src", f"{TRANSFORMERS}.{path.stem}.{node.name}")
                defs = [s.lineno for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "forward"]
                if defs:
                    assert (sig.forward.line, sig.forward.owner) == (defs[-1], node.name)
                    checked += 1
    assert checked > 60


def test_the_shipped_workloads_pass(diffusers):
    """The forward kwargs runner/families pass and every preset's config, as today's workloads have
    them: no false error."""
    inputs = {"flux2": ["hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids", "return_dict",
                        "guidance"],
              "qwen-image": ["hidden_states", "encoder_hidden_states", "timestep", "img_shapes", "return_dict"]}
    for name, names in inputs.items():
        wl = yaml.safe_load((ROOT / "workloads" / f"{name}.yaml").read_text())
        sig = read_signature(diffusers, "src", wl["engines"]["diffusers"]["model_class"])
        configs = {p: list(v["config"]) for p, v in wl["presets"].items()}
        assert sig.forward and sig.init and check_inputs(sig, names, configs, f"{name}.yaml") == []


def test_unknown_forward_argument(diffusers):
    sig = read_signature(diffusers, "src", FLUX2)
    errors = check_inputs(sig, ["hidden_states", "img_shapes", "timestep", "txt_id"], {}, "flux.yaml")
    assert errors[0] == (
        f"flux.yaml: key 'inputs.forward.img_shapes': Flux2Transformer2DModel.forward ({FLUX2_FILE}:{sig.forward.line})"
        " takes no argument 'img_shapes'; it takes " + ", ".join(sig.forward.params))
    assert errors[1].startswith("flux.yaml: key 'inputs.forward.txt_id': ")
    assert errors[1].endswith("; did you mean 'txt_ids'?") and len(errors) == 2


def test_missing_required_forward_argument(diffusers):
    sig = read_signature(diffusers, "src", f"{TRANSFORMERS}.transformer_wan.WanTransformer3DModel")
    errors = check_inputs(sig, ["hidden_states", "encoder_hidden_states"], {}, "wan.yaml")
    assert errors == ["wan.yaml: key 'inputs.forward': WanTransformer3DModel.forward "
                      f"(src/diffusers/models/transformers/transformer_wan.py:{sig.forward.line}) requires 'timestep', "
                      "which no input declares"]


def test_bad_config_key_with_suggestion(diffusers):
    sig = read_signature(diffusers, "src", f"{TRANSFORMERS}.transformer_sd3.SD3Transformer2DModel")
    configs = {"full": ["num_layers", "num_attention_heads"], "tiny": ["num_layers", "num_attention_head"]}
    errors = check_inputs(sig, ["hidden_states"], configs, "sd3.yaml")
    assert len(errors) == 1
    assert errors[0].startswith("sd3.yaml: key 'presets.tiny.config.num_attention_head': SD3Transformer2DModel.__init__ "
                                "(src/diffusers/models/transformers/transformer_sd3.py:")
    assert "takes no argument 'num_attention_head'; it takes sample_size, patch_size," in errors[0]
    assert errors[0].endswith("; did you mean 'num_attention_heads'?")
    # the key format is the caller's
    assert check_inputs(sig, ["hidden_states"], {"x": ["depth"]}, "w.yaml", config_key_fmt="model.{preset}")[0].startswith(
        "w.yaml: key 'model.x.depth': ")


def test_a_class_the_engine_does_not_define(diffusers):
    with pytest.raises(ConfigError) as e:
        read_signature(diffusers, "src", FLUX2.replace("Flux2T", "Flux3T"), workload_file="flux.yaml",
                       key="engines.diffusers.model_class")
    assert str(e.value).startswith(f"flux.yaml: key 'engines.diffusers.model_class': got '{FLUX2.replace('Flux2T', 'Flux3T')}';"
                                   f" expected a class defined in the engine; {FLUX2_FILE} defines no "
                                   "'Flux3Transformer2DModel' (close names: 'Flux2Transformer2DModel'")
    with pytest.raises(ConfigError, match="src/diffusers/models/transformers/__init__.py defines no 'transformer_flux9'"):
        read_signature(diffusers, "src", f"{TRANSFORMERS}.transformer_flux9.Flux9Model")
    with pytest.raises(ConfigError, match="expected a class; src/diffusers/models/transformers/__init__.py is a module"):
        read_signature(diffusers, "src", TRANSFORMERS)
    # outside the engine (the runner would import it from site-packages): not ours to judge
    assert read_signature(diffusers, "src", "torch.nn.Linear") is None


# -- synthetic engines --------------------------------------------------------------------------------

def engine(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "src" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path


def python_says(root: Path, model_class: str, method: str) -> tuple[str, ...]:
    """The parameters Python itself gives the method (torch-free synthetic engines only)."""
    import importlib
    import sys

    sys.path.insert(0, str(root / "src"))
    try:
        mod, _, cls = model_class.rpartition(".")
        fn = getattr(getattr(importlib.import_module(mod), cls), method)
        return tuple(inspect.signature(fn).parameters)[1:]
    finally:
        sys.path.remove(str(root / "src"))
        for name in [n for n in sys.modules if n.split(".")[0] == model_class.split(".")[0]]:
            del sys.modules[name]


BASE = """
class Base:
    def __init__(self, dim, depth=2):
        pass

    def forward(self, x, mask=None):
        pass
"""


def test_inheritance_within_a_module(tmp_path):
    root = engine(tmp_path, {"toy1/__init__.py": "", "toy1/models.py": BASE + """
class Mid(Base):
    def helper(self):
        pass

class Model(Mid):
    pass
"""})
    sig = read_signature(root, "src", "toy1.models.Model")
    assert (sig.forward.params, sig.forward.required, sig.forward.owner) == (("x", "mask"), ("x",), "Base")
    assert (sig.init.params, sig.init.required) == (("dim", "depth"), ("dim",))
    assert sig.forward.params == python_says(root, "toy1.models.Model", "forward")
    errors = check_inputs(sig, ["x", "maks"], {"tiny": ["depth"]}, "toy.yaml")
    assert errors == [
        "toy.yaml: key 'inputs.forward.maks': Model.forward (inherited from Base, src/toy1/models.py:6) takes no "
        "argument 'maks'; it takes x, mask; did you mean 'mask'?",
        "toy.yaml: key 'presets.tiny.config': Model.__init__ (inherited from Base, src/toy1/models.py:3) requires "
        "'dim', which preset 'tiny''s config does not set"]


@pytest.mark.parametrize("pkg, imports, base", [
    ("toy2", "from ..base import Base as Parent", "Parent"),
    ("toy3", "from .. import base", "base.Base"),
    ("toy4", "from toy4.base import Base", "Base"),
    ("toy5", "import toy5.base", "toy5.base.Base"),
    ("toy6", "from .. import Base", "Base"),  # re-exported by the package's __init__.py
])
def test_inheritance_via_an_import(tmp_path, pkg, imports, base):
    root = engine(tmp_path, {f"{pkg}/__init__.py": "from .base import Base\n", f"{pkg}/base.py": BASE,
                             f"{pkg}/sub/__init__.py": "", f"{pkg}/sub/model.py": f"""
{imports}

class Model({base}):
    def __init__(self, width, *args, **kwargs):
        pass
"""})
    sig = read_signature(root, "src", f"{pkg}.sub.model.Model")
    assert (sig.forward.params, sig.forward.file, sig.forward.owner) == (("x", "mask"), f"src/{pkg}/base.py", "Base")
    assert sig.forward.params == python_says(root, f"{pkg}.sub.model.Model", "forward")
    assert (sig.init.params, sig.init.var_positional, sig.init.var_keyword) == (("width",), True, True)
    assert check_inputs(sig, ["x"], {"p": ["width", "anything"]}, "w.yaml") == []  # **kwargs takes any name


def test_method_resolution_order(tmp_path):
    """Python's C3 order, not depth-first: D(B, C) with B(A) and C(A) takes C.forward over A's."""
    root = engine(tmp_path, {"toy7/__init__.py": "", "toy7/m.py": """
class A:
    def forward(self, a):
        pass

class B(A):
    pass

class C(A):
    def forward(self, c):
        pass

class D(B, C):
    pass
"""})
    sig = read_signature(root, "src", "toy7.m.D")
    assert sig.forward.params == ("c",) == python_says(root, "toy7.m.D", "forward")
    assert sig.init is None  # object's: not modelled


def test_base_outside_the_engine_is_unknown(tmp_path):
    root = engine(tmp_path, {"toy8/__init__.py": "", "toy8/m.py": """
import torch.nn as nn
from torch import nn as tnn

class Mixin:
    def forward(self, x):
        pass

class Plain(nn.Module):
    def __init__(self, dim):
        pass

class ModuleFirst(tnn.Module, Mixin):
    pass

class MixinFirst(Mixin, nn.Module):
    pass
"""})
    sig = read_signature(root, "src", "toy8.m.Plain")
    assert sig.forward is None and sig.init.params == ("dim",)
    assert check_inputs(sig, ["whatever"], {}, "w.yaml") == []  # no false error
    # torch.nn.Module precedes Mixin: its forward is the one called, unknown here
    assert read_signature(root, "src", "toy8.m.ModuleFirst").forward is None
    assert read_signature(root, "src", "toy8.m.MixinFirst").forward.params == ("x",)


@pytest.mark.parametrize("source", [
    # bound two ways: which one runs depends on the environment
    "try:\n    from .base import Base\nexcept ImportError:\n    Base = object\n\nclass Model(Base):\n    pass\n",
    # bound by assignment in the class body
    "from .base import Base\n\nclass Model(Base):\n    forward = Base.__init__\n    __init__ = Base.forward\n",
    # a class decorator may add methods (@dataclass adds __init__)
    "from .base import Base\nfrom dataclasses import dataclass\n\n@dataclass\nclass Mid(Base):\n    pass\n\n"
    "class Model(Mid):\n    pass\n",
])
def test_what_the_source_does_not_settle_is_unknown(tmp_path, source):
    root = engine(tmp_path, {"toy9/__init__.py": "", "toy9/base.py": BASE, "toy9/m.py": source})
    sig = read_signature(root, "src", "toy9.m.Model")
    assert sig.forward is None and sig.init is None


def test_keyword_only_and_positional_only(tmp_path):
    root = engine(tmp_path, {"toy10/__init__.py": "", "toy10/m.py": """
class Model:
    def forward(self, x, /, y, *, z, w=1):
        pass
"""})
    f = read_signature(root, "src", "toy10.m.Model").forward
    assert (f.params, f.required, f.positional_only) == (("x", "y", "z", "w"), ("x", "y", "z"), ("x",))
    errors = check_inputs(read_signature(root, "src", "toy10.m.Model"), ["x", "y"], {}, "w.yaml")
    assert "takes 'x' only by position" in errors[0] and errors[1].endswith("requires 'x' by position, which a keyword cannot give")
    assert errors[2].endswith("requires 'z', which no input declares") and len(errors) == 3


def test_missing_class_names_the_key(tmp_path):
    root = engine(tmp_path, {"toy11/__init__.py": "", "toy11/m.py": BASE})
    with pytest.raises(ConfigError) as e:
        read_signature(root, "src", "toy11.m.Bose", workload_file="toy.yaml", key="engines.toy.model_class")
    assert str(e.value) == ("toy.yaml: key 'engines.toy.model_class': got 'toy11.m.Bose'; expected a class defined "
                            "in the engine; src/toy11/m.py defines no 'Bose' (close names: 'Base')")
    with pytest.raises(ConfigError, match="src/toy11/__init__.py defines no 'n'"):
        read_signature(root, "src", "toy11.n.Base")
    with pytest.raises(ConfigError, match="expected a dotted path package.module.Class"):
        read_signature(root, "src", "Base")


def test_parsed_once_per_file_and_again_when_it_changes(tmp_path, monkeypatch):
    root = engine(tmp_path, {"toy12/__init__.py": "", "toy12/m.py": BASE + "\nclass Model(Base):\n    pass\n"})
    parses = []
    real = ast.parse
    monkeypatch.setattr(model_signature.ast, "parse", lambda text, name: parses.append(name) or real(text, name))
    read_signature(root, "src", "toy12.m.Model")
    read_signature(root, "src", "toy12.m.Base")
    assert parses == [str(root / "src/toy12/m.py")]
    (root / "src/toy12/m.py").write_text("class Model:\n    def forward(self, latents):\n        pass\n")
    assert read_signature(root, "src", "toy12.m.Model").forward.params == ("latents",)
