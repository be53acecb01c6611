"""A Primus-style training recipe and launch environment, read for ``mxcheck lint``.

A recipe is either a flat mapping of Megatron/Primus keys or a Primus experiment file
(``modules: {pre_trainer: {model: ..., overrides: {...}}}``); either way it becomes one flat
mapping whose nested sections read as dotted keys (``torch_compile.enable``). Primus'
``${NAME:default}`` placeholders resolve against the launch environment when one is given,
else to their default, as Primus' loader does at launch.

A key the recipe leaves out takes its Megatron/Primus code default from ``DEFAULTS``;
``Recipe.is_set`` tells an explicit value from a default where a rule needs that.
Included files (``config: pre_trainer.yaml``, ``model: diffusion/flux_12b.yaml``) are not
read: their values count as defaults.

YAML anchors and aliases are allowed, but a document whose aliases would expand past
``MAX_YAML_NODES`` nodes (a "billion laughs" bomb: each level of aliases multiplies the size)
or that refers to itself (``a: &x {b: *x}``) is refused while still a node graph, before any
Python object is built: a linter must not hang or crash on the file it was asked to judge.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BACKEND_ENV",
    "BACKEND_NAMES",
    "DEFAULTS",
    "MAX_YAML_NODES",
    "Recipe",
    "load_recipe",
    "parse_backend_env",
    "parse_env_file",
    "recipe_from_mapping",
]

# Code defaults of the keys the rules read. Megatron: transformer_impl, gradient_accumulation_fusion
# (on unless --no-gradient-accumulation-fusion), sequence_parallel, parallel sizes,
# attention_backend (AttnBackend.auto), use_precision_aware_optimizer, main_grads_dtype.
# Primus: fp4_recipe (nvfp4: an MXFP4 recipe left on it trains NVFP4), enable_primus_turbo,
# BaseDiffusionConfig's fp6/mxfp* fields (research/primus_stack.md 6.4).
DEFAULTS: dict[str, Any] = {
    "fp4": None,
    "fp4_recipe": "nvfp4",
    "fp4_use_native_te_autocast": False,
    "fp6": None,
    "fp8": None,
    "transformer_impl": "transformer_engine",
    "enable_primus_turbo": False,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "gradient_accumulation_fusion": True,
    "sequence_parallel": False,
    "mxfp4_backward_precision": "mxfp4",
    "mxfp6_backward_precision": "mxfp6",
    "mxfp4_to_fp8_switch_iter": 0,
    "mxfp6_fused_wgrad_accum": False,
    "attention_backend": "auto",
    "torch_compile.enable": False,
    "use_precision_aware_optimizer": False,
    "main_params_dtype": "fp32",
    "main_grads_dtype": "fp32",
    "exp_avg_dtype": "fp32",
    "exp_avg_sq_dtype": "fp32",
    "micro_batch_size": None,
    "global_batch_size": None,
    "seq_length": None,
    "num_microbatches": None,
    "data_parallel_size": None,
}

# Primus-Turbo GlobalBackendManager (primus_turbo/pytorch/core/backend.py): the env var,
# the BackendType members, and the precision names its parser accepts.
BACKEND_ENV = "PRIMUS_TURBO_GEMM_BACKEND"
BACKEND_NAMES = ("CK", "HIPBLASLT", "AITER", "TRITON", "DEEP_EP", "TURBO", "FLYDSL",
                 "HIPKITTENS", "GLUON")
_PRECISIONS = {"FP4": "FP4", "FP8": "FP8", "BF16": "BF16", "FP16": "BF16", "FP32": "BF16"}
_AUTOTUNE = "AUTOTUNE"
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")
# A Primus experiment file has a few hundred nodes; aliases may not expand a document past this.
MAX_YAML_NODES = 100_000


def _node_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root: yaml.Node, limit: int = MAX_YAML_NODES) -> None:
    """ValueError if ``root`` expanded (every alias replaced by its anchor's copy) would have
    more than ``limit`` nodes, or if a node reaches itself through an alias. Counts with a
    memo per shared node, so a bomb is measured in time linear in the file, never expanded."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in on_path:
            raise ValueError(f"line {node.start_mark.line + 1}: an anchor contains an alias to "
                             "itself, so the recipe would be infinitely deep; replace the alias "
                             "with a copy of the values it needs")
        on_path.add(id(node))
        total = 1
        for child in _node_children(node):
            total += size(child)
            if total > limit:
                raise ValueError(f"its aliases expand to more than {limit:,} YAML nodes "
                                 "(a 'billion laughs' alias bomb?); write the values out "
                                 "instead of nesting aliases")
        on_path.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root)


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that checks each composed document with ``_check_expansion``."""

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses alias bombs and self-references (ValueError) and deep
    nesting (ValueError instead of RecursionError); yaml.YAMLError for text that is not YAML."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: no Python tags
    except RecursionError:
        raise ValueError("nested too deeply to read (Python's recursion limit); "
                         "a recipe is a few levels of mappings") from None


@dataclass(frozen=True)
class Recipe:
    """A flat recipe: explicit values by dotted key, the source and the Flux model it trains."""

    values: Mapping[str, Any]
    source: str = "<recipe>"
    model: str = "flux-12b"

    def is_set(self, key: str) -> bool:
        return key in self.values

    def get(self, key: str) -> Any:
        """The recipe's value, else the code default (a key without a default is a bug)."""
        return self.values[key] if key in self.values else DEFAULTS[key]

    def shown(self, key: str) -> str:
        """The value as a finding shows it, saying when it is the default."""
        value = self.get(key)
        return repr(value) if self.is_set(key) else f"{value!r} (default)"


def _flatten(data: Mapping[str, Any], prefix: str = "",
             parents: tuple[int, ...] = ()) -> dict[str, Any]:
    # ``parents`` are the ids of the enclosing mappings: a mapping built in Python that
    # contains itself would otherwise recurse until RecursionError.
    if id(data) in parents:
        raise ValueError(f"{prefix.rstrip('.')} contains itself; a recipe must be a tree of "
                         "mappings")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}.", (*parents, id(data))))
        else:
            out[name] = value
    return out


def _resolve(value: Any, env: Mapping[str, str] | None) -> Any:
    """``${NAME:default}`` -> the env value, else the default; a whole-value placeholder is
    re-read as YAML so ``${PRIMUS_SEED:2025}`` is the int 2025, as Primus' loader gives."""
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if env is not None and name in env:
            return env[name]
        return m.group(0) if default is None else default

    text = _PLACEHOLDER.sub(sub, value)
    if _PLACEHOLDER.fullmatch(value.strip()):
        try:
            return _load_yaml(text) if text.strip() else None
        except (yaml.YAMLError, ValueError):
            return text
    return text


def _model_name(module: Mapping[str, Any], overrides: Mapping[str, Any]) -> str:
    # Only the 535M CI model differs from Flux 12B in depth; widths (all a rule reads) match.
    hint = f"{module.get('model', '')} {overrides.get('model_type', '')}".lower()
    if "535m" in hint:
        return "flux-535m"
    return "flux-12b-schnell" if "schnell" in hint else "flux-12b"


def recipe_from_mapping(data: Any, *, source: str = "<recipe>",
                        env: Mapping[str, str] | None = None) -> Recipe:
    """A Recipe from parsed YAML: a flat mapping or a Primus ``modules:`` experiment."""
    if not isinstance(data, Mapping):
        raise TypeError(f"recipe {source}: expected a mapping of keys, got "
                        f"{type(data).__name__}")
    module: Mapping[str, Any] = {}
    overrides: Mapping[str, Any] = data
    modules = data.get("modules")
    if isinstance(modules, Mapping):
        # The trainer module's overrides are the recipe (Primus experiment layout).
        candidates = [m for m in modules.values()
                      if isinstance(m, Mapping) and isinstance(m.get("overrides"), Mapping)]
        chosen = modules.get("pre_trainer")
        module = chosen if isinstance(chosen, Mapping) else (candidates[0] if candidates else {})
        if not isinstance(module.get("overrides"), Mapping):
            raise ValueError(f"recipe {source}: 'modules' has no module with an 'overrides' "
                             "mapping; expected modules.pre_trainer.overrides")
        overrides = module["overrides"]
    try:
        flat = _flatten(overrides)
    except ValueError as e:
        raise ValueError(f"recipe {source}: {e}") from None
    values = {k: _resolve(v, env) for k, v in flat.items()}
    return Recipe(values, source=source, model=_model_name(module, overrides))


def load_recipe(path: str | Path, env: Mapping[str, str] | None = None) -> Recipe:
    """Read a YAML recipe. OSError if unreadable; ValueError naming the file if not YAML."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        data = _load_yaml(text)
    except yaml.YAMLError as e:
        raise ValueError(f"recipe {path}: not valid YAML: {e}".replace("\n", " ")) from None
    except ValueError as e:
        raise ValueError(f"recipe {path}: {e}") from None
    try:
        return recipe_from_mapping(data, source=str(path), env=env)
    except TypeError as e:
        raise ValueError(str(e)) from None


def parse_env_file(text: str, *, source: str = "<env>") -> dict[str, str]:
    """KEY=VALUE lines (``export`` prefix, quotes, blank lines and ``#`` comments allowed)."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"env file {source} line {number}: expected KEY=VALUE, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def _backend_choice(name: str, env_value: str) -> str:
    name = name.strip().upper()
    if name != _AUTOTUNE and name not in BACKEND_NAMES:
        # Primus-Turbo: BackendType[name] -> KeyError on the first GEMM.
        raise ValueError(f"{BACKEND_ENV}={env_value!r}: backend {name!r} is not one of "
                         f"{', '.join(BACKEND_NAMES)} or {_AUTOTUNE}")
    return name


def parse_backend_env(value: str) -> dict[str, str | None]:
    """What Primus-Turbo reads from ``PRIMUS_TURBO_GEMM_BACKEND``: precision (FP4, FP8, BF16)
    -> backend name, ``AUTOTUNE``, or None (not pinned). Mirrors
    ``GlobalBackendManager._extract_backend_from_env``: ``NAME`` pins every precision;
    ``FP4:AITER,other:CK`` pins per precision. ValueError where Primus-Turbo raises."""
    if not value.strip():
        raise ValueError(f"{BACKEND_ENV}={value!r} is empty")
    if not any(word in value.lower() for word in ("fp4", "fp8", "bf16", "fp16", "fp32", "other")):
        choice = _backend_choice(value, value)
        return dict.fromkeys(("FP4", "FP8", "BF16"), choice)
    table: dict[str, str | None] = {}
    other: str | None = None
    for pair in value.split(","):
        if not pair.strip():
            continue
        precision, sep, backend = pair.partition(":")
        precision = precision.strip().upper()
        if not sep or ":" in backend:
            raise ValueError(f"{BACKEND_ENV}={value!r}: {pair.strip()!r} is not PRECISION:BACKEND")
        if precision == "OTHER":
            other = _backend_choice(backend, value)
        elif precision in _PRECISIONS:
            table[_PRECISIONS[precision]] = _backend_choice(backend, value)
        else:
            raise ValueError(f"{BACKEND_ENV}={value!r}: precision {precision!r} is not one of "
                             f"{', '.join(_PRECISIONS)} or OTHER")
    return {p: table.get(p, other) for p in ("FP4", "FP8", "BF16")}
