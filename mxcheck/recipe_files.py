"""Recipes from files (YAML or TOML), and the one resolver every claim goes through.

A recipe file is the six ``OperandSpec``s of a linear and what surrounds them::

    name: my-kernel-mxfp8           # required
    source: my_kernels/quant.cu     # optional, shown in reports
    out_dtype: bfloat16             # bfloat16 (default), float16 or float32
    shape_multiple: 1               # every GEMM dim must be a multiple of this
    all:                            # OperandSpec fields for all six copies
      fmt: e4m3
      scaling: mx
      scale_rule: floor
    w_row: {block_2d: true}         # per-copy overrides: x_row w_row g_row w_col g_col x_col

``profile`` (in ``all`` or a copy) is a registered profile's name, or a profile stated
inline with any of its kind's fields (``mxcheck profiles NAME`` lists them); the spec fields
the profile repeats (scale rule, rounding, ...) are set from it, as ``Recipe.with_profile``
does. ``mxcheck fit --write`` writes one::

    x_row:
      profile: {kind: mx, name: mylib.mxfp8, fmt: e4m3, scale_rule: even, scale_mbits: 1,
                zero_sign: never, inf_amax_byte: 254}

Every key is checked: an unknown one, or a bad value, is a ValueError naming the file, the
key path (``all.scale_rule``), the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import yaml

from mxcheck.profiles import ALL_PROFILES, PROFILE_KINDS, register_profile
from mxcheck.recipes import OPERANDS, OperandSpec, Recipe, get_recipe
from mxcheck.text import did_you_mean

__all__ = ["RECIPE_FILE_SUFFIXES", "load_recipe_file", "profile_table", "resolve_recipe"]

RECIPE_FILE_SUFFIXES = (".yaml", ".yml", ".toml")
_OUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(OperandSpec)}
_TOP_KEYS = ("name", "source", "notes", "out_dtype", "shape_multiple", "all", *OPERANDS)
_TYPES = {"int": int, "bool": bool, "str": str, "int | None": int, "str | None": str}


def _unknown(path: Path, key: str, allowed: tuple[str, ...] | list[str]) -> ValueError:
    hint = did_you_mean(key.rsplit(".", 1)[-1], list(allowed))
    return ValueError(f"recipe file {path}: key {key!r} is not known{hint}; expected one of {list(allowed)}")


def _read(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            import tomllib  # noqa: PLC0415  (Python >= 3.11)
        except ModuleNotFoundError:
            raise ValueError(f"recipe file {path}: TOML needs Python >= 3.11; write it as YAML") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"recipe file {path}: not valid TOML ({e})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"recipe file {path}: not valid YAML ({e})") from None


_PROFILE_META = ("kind", "name", "source", "notes")


def _inline_profile(path: Path, key: str, table: dict[str, Any]) -> Any:
    """A profile stated inline: ``kind`` (mx, nvfp4, tensor) and any of that kind's fields,
    registered under ``name`` (default: the key path)."""
    kind = table.get("kind")
    if kind not in PROFILE_KINDS:
        raise ValueError(f"recipe file {path}: key '{key}.kind' = {kind!r}; expected one of {list(PROFILE_KINDS)}")
    cls = PROFILE_KINDS[kind]
    allowed = [f.name for f in dataclasses.fields(cls)]
    fields: dict[str, Any] = {}
    for name, value in table.items():
        if name == "kind":
            continue
        if name not in allowed:
            raise _unknown(path, f"{key}.{name}", ["kind", *allowed])
        fields[name] = tuple(value) if isinstance(value, list) else value
    fields.setdefault("name", key)
    fields.setdefault("source", str(path))
    try:
        p = cls(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"recipe file {path}: key {key!r}: {e}") from None
    try:
        return register_profile(p)
    except ValueError as e:
        raise ValueError(f"recipe file {path}: key '{key}.name': {e}") from None


def profile_table(p: Any) -> dict[str, Any]:
    """A profile as the inline table a recipe file takes (every field; what
    ``load_recipe_file`` reads back as the same profile)."""
    kind = next(k for k, cls in PROFILE_KINDS.items() if type(p) is cls)
    out: dict[str, Any] = {"kind": kind}
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def _spec_fields(path: Path, key: str, table: Any) -> dict[str, Any]:
    """An operand table's fields, each checked against OperandSpec's field types; an inline
    profile is registered and the spec fields it repeats are set from it."""
    if not isinstance(table, dict):
        raise ValueError(f"recipe file {path}: key {key!r} must be a table of OperandSpec fields, "
                         f"got {type(table).__name__}")
    out = {}
    for name, value in table.items():
        if name == "profile" and isinstance(value, dict):
            p = _inline_profile(path, f"{key}.profile", value)
            out.update({f: getattr(p, f) for f in p.spec_fields}, profile=p.name)
            continue
        if name not in _SPEC_FIELDS:
            raise _unknown(path, f"{key}.{name}", list(_SPEC_FIELDS))
        kind = str(_SPEC_FIELDS[name].type)
        want = _TYPES.get(kind)
        nullable = "None" in kind
        if not (value is None and nullable) and want is not None and \
                (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            raise ValueError(f"recipe file {path}: key '{key}.{name}' = {value!r}; expected {kind}")
        out[name] = value
    return out


def load_recipe_file(path: str | Path) -> Recipe:
    """The Recipe a YAML or TOML file describes (see the module docstring for the keys)."""
    path = Path(path)
    if path.suffix not in RECIPE_FILE_SUFFIXES:
        raise ValueError(f"recipe file {path}: suffix {path.suffix!r}; expected one of {list(RECIPE_FILE_SUFFIXES)}")
    if not path.is_file():
        raise ValueError(f"recipe file {path}: no such file")
    data = _read(path)
    if not isinstance(data, dict):
        raise ValueError(f"recipe file {path}: expected a table of keys {list(_TOP_KEYS)}, got {type(data).__name__}")
    for key in data:
        if key not in _TOP_KEYS:
            raise _unknown(path, str(key), _TOP_KEYS)
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise ValueError(f"recipe file {path}: key 'name' is required: a non-empty string naming the recipe")
    base = _spec_fields(path, "all", data.get("all", {}))
    specs = {}
    for op in OPERANDS:
        fields = base | _spec_fields(path, op, data.get(op, {}))
        try:
            specs[op] = OperandSpec(**fields)
        except (TypeError, ValueError) as e:
            raise ValueError(f"recipe file {path}: operand {op} ({fields}): {e}") from None
    out_dtype = data.get("out_dtype", "bfloat16")
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"recipe file {path}: key 'out_dtype' = {out_dtype!r}; expected one of {list(_OUT_DTYPES)}")
    multiple = data.get("shape_multiple", 1)
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"recipe file {path}: key 'shape_multiple' = {multiple!r}; expected a positive integer")
    notes = data.get("notes", [])
    if isinstance(notes, str):
        notes = [notes]
    return Recipe(data["name"], **specs, out_dtype=_OUT_DTYPES[out_dtype], shape_multiple=multiple,
                  source=str(data.get("source", path)), notes=tuple(str(n) for n in notes))


def resolve_recipe(claim: str | Path | Recipe) -> Recipe:
    """A claim as a Recipe: a Recipe, a built-in name (``ocp-mxfp8-e4m3``, ``mxfp4+sr``), the
    path of a recipe file, or either followed by ``@PROFILE`` (``my.yaml@modelopt.nvfp4``: the
    file's recipe pinned to the profile, as ``NAME@PROFILE`` pins a built-in one). ValueError
    names the claim and the nearest known name."""
    if isinstance(claim, Recipe):
        return claim
    if isinstance(claim, Path) or str(claim).endswith(RECIPE_FILE_SUFFIXES):
        return load_recipe_file(claim)
    if isinstance(claim, str) and "@" in claim:
        base, _, profile = claim.rpartition("@")
        if base.endswith(RECIPE_FILE_SUFFIXES):
            recipe = load_recipe_file(base)
            if profile not in ALL_PROFILES:
                raise ValueError(f"recipe={claim!r}: {profile!r} is not a known profile"
                                 f"{did_you_mean(profile, list(ALL_PROFILES))}; known profiles: "
                                 f"{', '.join(ALL_PROFILES)}")
            return recipe.with_profile(profile)
    if not isinstance(claim, str):
        raise TypeError(f"claim={claim!r}: expected a recipe name, a recipe file path or a Recipe")
    return get_recipe(claim)
