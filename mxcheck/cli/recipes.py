"""``mxcheck recipes`` and ``mxcheck profiles``: what each built-in recipe and profile is,
collected as JSON-able data and rendered as text beside it."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from mxcheck.cli.common import CommandError, add_json_flag, out, to_json
from mxcheck.text import did_you_mean, table

__all__ = ["profile_fields", "profiles_text", "recipe_rows", "recipes_text"]

# The recipe tables, in the order `mxcheck recipes` shows them, with what each table is.
_TABLES = (
    ("RECIPES", "training stacks' recipes"),
    ("PLAIN_RECIPES", "plain recipes: the format as its specification states it"),
    ("OCP_MX_RECIPES", "OCP MX v1.0 recipes"),
    ("DERIVED_RECIPES", "stochastic-rounding variants"),
)


def recipe_rows() -> list[dict[str, Any]]:
    """Every built-in recipe: its table, name, source, notes and what each operand copy does."""
    from mxcheck import recipes  # noqa: PLC0415  (torch's stack loads late)

    rows = []
    for table_name, what in _TABLES:
        for name, r in getattr(recipes, table_name).items():
            rows.append({"table": table_name, "kind": what, "name": name, "source": r.source,
                         "notes": list(r.notes), "out_dtype": str(r.out_dtype).removeprefix("torch."),
                         "shape_multiple": r.shape_multiple,
                         "operands": {op: r.spec(op).describe() for op in recipes.OPERANDS}})
    return rows


def recipes_text(rows: list[dict[str, Any]]) -> str:
    text, kind = [], None
    for r in rows:
        if r["kind"] != kind:
            kind = r["kind"]
            text.append(f"{'' if not text else chr(10)}== {kind} ({r['table']}) ==\n")
        text.append(f"\n{r['name']}\n  source: {r['source'] or '-'}\n")
        text += [f"  note: {n}\n" for n in r["notes"]]
        if r["shape_multiple"] != 1:
            text.append(f"  M, N, K multiples of {r['shape_multiple']}\n")
        text.append(table(list(r["operands"].items()), indent="    "))
    return "".join(text)


def recipes_args(p: argparse.ArgumentParser) -> None:
    add_json_flag(p)


def run_recipes(args: argparse.Namespace) -> int:
    rows = recipe_rows()
    out(to_json(rows) if args.json else recipes_text(rows))
    return 0


def _value(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def profile_fields(name: str) -> dict[str, Any]:
    """Every field of profile ``name`` (its kind, the scaling it pins, then each dataclass
    field with its value); CommandError naming the nearest known profile."""
    from mxcheck.profiles import ALL_PROFILES  # noqa: PLC0415

    if name not in ALL_PROFILES:
        raise CommandError(f"profile {name!r} is not known{did_you_mean(name, list(ALL_PROFILES))}; "
                           f"known profiles: {', '.join(ALL_PROFILES)} (mxcheck profiles lists them)")
    p = ALL_PROFILES[name]
    return {"kind": type(p).__name__, "scaling": p.scaling,
            **{f.name: _value(getattr(p, f.name)) for f in dataclasses.fields(p)}}


def profiles_text(name: str | None) -> str:
    from mxcheck.profiles import ALL_PROFILES  # noqa: PLC0415

    if name is None:
        rows = [("profile", "kind", "scaling", "format", "source")]
        rows += [(n, type(p).__name__, p.scaling, p.fmt or "(any)", p.source) for n, p in ALL_PROFILES.items()]
        return table(rows, indent="") + "\n`mxcheck profiles NAME` prints every field of one.\n"
    fields = profile_fields(name)
    rows = [(k, "; ".join(v) if k == "notes" else repr(v) if isinstance(v, str) or v is None else str(v))
            for k, v in fields.items()]
    return table(rows, indent="")


def profiles_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME", help="a profile: print every field of it (default: list all)")
    add_json_flag(p)


def run_profiles(args: argparse.Namespace) -> int:
    if args.json:
        from mxcheck.profiles import ALL_PROFILES  # noqa: PLC0415

        names = [args.name] if args.name else list(ALL_PROFILES)
        out(to_json({n: profile_fields(n) for n in names}))
    else:
        out(profiles_text(args.name))
    return 0
