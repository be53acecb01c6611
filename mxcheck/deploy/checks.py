"""The checks behind ``mxcheck lint``'s rules: predicates on what a recipe runs, check
factories (one per kind of rule) and the checks that are one of a kind.

A check takes a ``Context`` and yields ``Hit``s; ``mxcheck.deploy.lint.RULES`` gives each
an id and a severity. Facts: research/primus_stack.md (6.2 MXFP4 local-spec guards and
preshuffle contract, 6.4 config validation, 2.1 the MXFP6 256 tile) and Primus-Turbo's
``GlobalBackendManager`` for the backend env vars.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mxcheck.deploy.recipe import BACKEND_ENV, DEFAULTS, Recipe, parse_backend_env
from mxcheck.flux import flux_linear_shapes, unique_gemms

__all__ = [
    "ATTENTION_BACKENDS",
    "AUTO_TUNE_ENV",
    "MXFP4_BACKWARD_PRECISIONS",
    "MXFP6_BACKWARD_PRECISIONS",
    "MXFP6_FORMATS",
    "MXFP6_TILE",
    "Check",
    "Context",
    "Hit",
    "autotune_off_for_mxfp4",
    "backend_env_parses",
    "dtypes_need_precision_aware",
    "excludes_fp6",
    "fp4_pinned_to_aiter",
    "fp4_recipe_mxfp4",
    "fp6",
    "fp8_autotuned",
    "fp8_not_pinned",
    "fused_wgrad",
    "fused_wgrad_bf16_main_grads",
    "fused_wgrad_one_microbatch",
    "mxfp4",
    "mxfp4_local",
    "mxfp6_tiles",
    "needs_format",
    "one_of",
    "requires",
    "te_fp4_not_compiled",
]

AUTO_TUNE_ENV = "PRIMUS_TURBO_AUTO_TUNE"
MXFP6_FORMATS = ("mxfp6",)                       # BaseDiffusionConfig.MXFP6_FORMATS
MXFP6_BACKWARD_PRECISIONS = ("mxfp6", "fp8")     # BaseDiffusionConfig
MXFP4_BACKWARD_PRECISIONS = ("mxfp4", "fp8")     # BaseDiffusionConfig docstring
ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")  # Megatron AttnBackend
MXFP6_TILE = 256                                 # Primus-Turbo MXFP6_TILE_SIZE: M, N and K


@dataclass(frozen=True)
class Hit:
    """What a check found: the key, its value as shown, what is wrong, and the fix."""

    key: str
    value: str
    message: str
    fix: str


@dataclass(frozen=True)
class Context:
    """What a check reads: the recipe, the launch env (None: not checked), token split, DP."""

    recipe: Recipe
    env: Mapping[str, str] | None = None
    txt_tokens: int = 256
    dp_size: int | None = None


Check = Callable[[Context], Iterator[Hit]]


# ---- what a recipe runs (shared predicates, not rules) ------------------------------


def mxfp4(r: Recipe) -> bool:
    return r.get("fp4") == "mxfp4"


def _local(r: Recipe) -> bool:
    return r.get("transformer_impl") == "local"


def mxfp4_local(r: Recipe) -> bool:
    # The Primus-Turbo MXFP4 local spec; TE-native autocast builds TE linears instead.
    return mxfp4(r) and _local(r) and not r.get("fp4_use_native_te_autocast")


def fp6(r: Recipe) -> bool:
    return r.get("fp6") is not None


def _fp8_local(r: Recipe) -> bool:
    return r.get("fp8") is not None and _local(r) and bool(r.get("enable_primus_turbo"))


def _backends(env: Mapping[str, str]) -> dict[str, str | None] | None:
    """precision -> pinned backend; {} when unset; None when unparsable (MX019 reports it)."""
    if BACKEND_ENV not in env:
        return {}
    try:
        return parse_backend_env(env[BACKEND_ENV])
    except ValueError:
        return None


def _env_shown(env: Mapping[str, str], name: str) -> str:
    return repr(env[name]) if name in env else "unset"


def _yaml(value: Any) -> str:
    """A value as a recipe writes it (true, null, mxfp4)."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


# ---- check factories (one per kind of rule; a rule is a call with its data) ----------


def requires(key: str, want: Any, when: Callable[[Recipe], bool], what: str, why: str) -> Check:
    """When ``when(recipe)``, ``key`` must equal ``want``."""
    def check(ctx: Context) -> Iterator[Hit]:
        r = ctx.recipe
        if when(r) and r.get(key) != want:
            yield Hit(key, r.shown(key), f"{what} needs {key}={want!r}: {why}",
                      f"set {key}: {_yaml(want)}")
    return check


def excludes_fp6(key: str, active: Callable[[Any], bool], why: str, fix: str) -> Check:
    """With ``fp6`` set, ``key`` must not be active (BaseDiffusionConfig raises ValueError)."""
    def check(ctx: Context) -> Iterator[Hit]:
        r = ctx.recipe
        if fp6(r) and active(r.get(key)):
            yield Hit(key, r.shown(key), f"fp6={r.get('fp6')!r} and {key}={r.get(key)!r} "
                      f"cannot both be set: {why}", fix)
    return check


def one_of(key: str, allowed: tuple[str, ...], why: str) -> Check:
    """An explicit ``key`` must be one of ``allowed``."""
    def check(ctx: Context) -> Iterator[Hit]:
        r = ctx.recipe
        if r.is_set(key) and r.get(key) is not None and r.get(key) not in allowed:
            yield Hit(key, r.shown(key), f"{key}={r.get(key)!r} is not one of "
                      f"{', '.join(allowed)}: {why}", f"set {key} to one of {', '.join(allowed)}")
    return check


def needs_format(key: str, format_key: str, format_on: Callable[[Recipe], bool],
                  effect: str) -> Check:
    """A non-default ``key`` does something only when its format is on."""
    def check(ctx: Context) -> Iterator[Hit]:
        r = ctx.recipe
        if r.get(key) != DEFAULTS[key] and not format_on(r):
            yield Hit(key, r.shown(key), f"{key}={r.get(key)!r} without "
                      f"{format_key}={r.get(format_key)!r}: {effect}",
                      f"set {format_key}, or drop {key}")
    return check


# ---- checks that are one of a kind ---------------------------------------------------


def fp4_recipe_mxfp4(ctx: Context) -> Iterator[Hit]:
    r = ctx.recipe
    if mxfp4(r) and r.get("fp4_recipe") != "mxfp4":
        yield Hit("fp4_recipe", r.shown("fp4_recipe"),
                  f"fp4='mxfp4' with fp4_recipe={r.get('fp4_recipe')!r}: the FP4 recipe decides "
                  "the block format, so this run silently trains NVFP4 (Primus' default "
                  "fp4_recipe is nvfp4)", "set fp4_recipe: mxfp4")


def _tokens(ctx: Context) -> tuple[int, int, int] | Hit:
    """(micro batch, image tokens, text tokens) or a Hit saying what is missing."""
    r = ctx.recipe
    mbs, seq = r.get("micro_batch_size"), r.get("seq_length")
    for key, v in (("micro_batch_size", mbs), ("seq_length", seq)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return Hit(key, r.shown(key), f"MXFP6 GEMM shapes need {key} as a positive int",
                       f"set {key}")
    if seq <= ctx.txt_tokens:
        return Hit("seq_length", r.shown("seq_length"),
                   f"seq_length={seq} leaves no image tokens after {ctx.txt_tokens} text tokens",
                   "set seq_length = image tokens + text tokens (Flux MLPerf: 512 = 256 + 256), "
                   "or pass the text-token count")
    return mbs, seq - ctx.txt_tokens, ctx.txt_tokens


def _misaligned(model: str, mbs: int, img: int, txt: int) -> dict[tuple[str, int, int, int],
                                                                   list[str]]:
    gemms = unique_gemms(flux_linear_shapes(model, mbs, img, txt))
    return {k: v for k, v in gemms.items() if any(d % MXFP6_TILE for d in k[1:])}


def mxfp6_tiles(ctx: Context) -> Iterator[Hit]:
    r = ctx.recipe
    if not fp6(r):
        return
    shape = _tokens(ctx)
    if isinstance(shape, Hit):
        yield shape
        return
    mbs, img, txt = shape
    bad = _misaligned(r.model, mbs, img, txt)
    if not bad:
        return
    listed = "; ".join(f"{d} M={m} N={n} K={k} ({layers[0]}{', ...' if len(layers) > 1 else ''})"
                       for (d, m, n, k), layers in list(bad.items())[:3])
    # The smallest larger micro batch that tiles, when the token counts allow one.
    better = next((b for b in range(mbs + 1, mbs + MXFP6_TILE + 1)
                   if not _misaligned(r.model, b, img, txt)), None)
    fix = (f"use micro_batch_size {better}" if better else
           f"make image and text token counts ({img}, {txt}) tile with the batch")
    yield Hit("micro_batch_size", f"{mbs} (image {img} + text {txt} tokens)",
              f"{len(bad)} replaced GEMM shape(s) of {r.model} are not multiples of "
              f"{MXFP6_TILE} in M, N and K, which the A6W6 kernel requires: {listed}",
              f"{fix}, so every M, N, K is a multiple of {MXFP6_TILE}")


def fp4_pinned_to_aiter(ctx: Context) -> Iterator[Hit]:
    assert ctx.env is not None
    table = _backends(ctx.env)
    if mxfp4_local(ctx.recipe) and table is not None and table.get("FP4") != "AITER":
        yield Hit(BACKEND_ENV, _env_shown(ctx.env, BACKEND_ENV),
                  f"the MXFP4 local spec preshuffles its operands only with the FP4 GEMM "
                  f"backend pinned to AITER (FP4 here: {table.get('FP4')}); without it "
                  "_assert_preshuffle_contract raises RuntimeError",
                  f"export {BACKEND_ENV}=FP4:AITER (add ,FP8:... for other precisions)")


def autotune_off_for_mxfp4(ctx: Context) -> Iterator[Hit]:
    assert ctx.env is not None
    if mxfp4_local(ctx.recipe) and ctx.env.get(AUTO_TUNE_ENV) == "1":
        yield Hit(AUTO_TUNE_ENV, _env_shown(ctx.env, AUTO_TUNE_ENV),
                  "autotune disables the MXFP4 preshuffle path (_enable_preshuffle needs "
                  "autotune off), so the MXFP4 local spec refuses to run",
                  f"unset {AUTO_TUNE_ENV} (or set it to 0)")


def fp8_autotuned(ctx: Context) -> Iterator[Hit]:
    assert ctx.env is not None
    table = _backends(ctx.env) or {}
    if (_fp8_local(ctx.recipe) and ctx.env.get(AUTO_TUNE_ENV) != "1"
            and table.get("FP8") != "AUTOTUNE"):
        yield Hit(AUTO_TUNE_ENV, _env_shown(ctx.env, AUTO_TUNE_ENV),
                  "the FP8 local spec picks its GEMM backend per shape by autotune; without "
                  "it every FP8 GEMM runs on the code default",
                  f"export {AUTO_TUNE_ENV}=1")


def fp8_not_pinned(ctx: Context) -> Iterator[Hit]:
    assert ctx.env is not None
    table = _backends(ctx.env) or {}
    pinned = table.get("FP8")
    if _fp8_local(ctx.recipe) and pinned not in (None, "AUTOTUNE"):
        yield Hit(BACKEND_ENV, _env_shown(ctx.env, BACKEND_ENV),
                  f"FP8 GEMMs are pinned to {pinned}, which beats autotune (env var > "
                  "autotune in Primus-Turbo's priority order)",
                  f"pin FP4 only, e.g. {BACKEND_ENV}=FP4:AITER, or unset it")


def backend_env_parses(ctx: Context) -> Iterator[Hit]:
    assert ctx.env is not None
    if BACKEND_ENV not in ctx.env:
        return
    value = ctx.env[BACKEND_ENV]
    if not value.strip():
        yield Hit(BACKEND_ENV, repr(value),
                  f"{BACKEND_ENV} is set but empty: Primus-Turbo versions that parse it raise "
                  "KeyError '' on the first GEMM; newer ones ignore it, so an intended pin is "
                  "lost either way", f"unset {BACKEND_ENV} or give it a value such as FP4:AITER")
        return
    try:
        parse_backend_env(value)
    except ValueError as e:
        yield Hit(BACKEND_ENV, repr(value), f"{e}; Primus-Turbo raises on the first GEMM",
                  "use NAME or PRECISION:NAME[,PRECISION:NAME...], e.g. FP4:AITER")


def te_fp4_not_compiled(ctx: Context) -> Iterator[Hit]:
    r = ctx.recipe
    if r.get("fp4") is not None and r.get("fp4_use_native_te_autocast") \
            and r.get("torch_compile.enable"):
        yield Hit("torch_compile.enable", r.shown("torch_compile.enable"),
                  "TE's native FP4 autocast toggles process-global quantization state, which "
                  "breaks torch.compile graph capture (graph breaks, stale guards)",
                  "set torch_compile.enable: false for fp4_use_native_te_autocast")


_OPTIMIZER_DTYPES = ("main_params_dtype", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


def dtypes_need_precision_aware(ctx: Context) -> Iterator[Hit]:
    r = ctx.recipe
    if r.get("use_precision_aware_optimizer"):
        return
    for key in _OPTIMIZER_DTYPES:
        if r.is_set(key):
            yield Hit(key, r.shown(key), f"{key} is read only by the precision-aware optimizer, "
                      "which is off: the setting is inert (main grads stay FP32)",
                      f"set use_precision_aware_optimizer: true, or drop {key}")


def _world_size(env: Mapping[str, str]) -> int | None:
    """Ranks from torchrun's WORLD_SIZE, else Primus' launcher NNODES x GPUS_PER_NODE."""
    if env.get("WORLD_SIZE", "").isdigit():
        return int(env["WORLD_SIZE"])
    nodes, gpus = env.get("NNODES", ""), env.get("GPUS_PER_NODE", "")
    return int(nodes) * int(gpus) if nodes.isdigit() and gpus.isdigit() else None


def _data_parallel(ctx: Context) -> int | None:
    r = ctx.recipe
    if ctx.dp_size is not None:
        return ctx.dp_size
    if isinstance(r.get("data_parallel_size"), int):
        return int(r.get("data_parallel_size"))
    world = _world_size(ctx.env or {})
    if world is None:
        return None
    return world // (int(r.get("tensor_model_parallel_size"))
                     * int(r.get("pipeline_model_parallel_size"))
                     * int(r.get("context_parallel_size")))


def fused_wgrad(r: Recipe) -> bool:
    return fp6(r) and bool(r.get("mxfp6_fused_wgrad_accum"))


def fused_wgrad_one_microbatch(ctx: Context) -> Iterator[Hit]:
    r = ctx.recipe
    if not fused_wgrad(r):
        return
    why = ("the A6W6 wgrad store has no beta=1 accumulate epilogue, so it overwrites "
           "main_grad and is valid only at one microbatch per optimizer step")
    if r.get("num_microbatches") is not None:
        if r.get("num_microbatches") != 1:
            yield Hit("num_microbatches", r.shown("num_microbatches"), why,
                      "set num_microbatches: 1 or mxfp6_fused_wgrad_accum: false")
        return
    mbs, gbs, dp = r.get("micro_batch_size"), r.get("global_batch_size"), _data_parallel(ctx)
    if gbs is None:  # Megatron: global batch defaults to micro batch * DP, one microbatch
        return
    if mbs is None or dp is None:
        yield Hit("global_batch_size", r.shown("global_batch_size"),
                  f"cannot confirm one microbatch per step without micro_batch_size and the "
                  f"data-parallel size; {why}",
                  "give the DP size (--dp-size, data_parallel_size, or WORLD_SIZE in the env)")
    elif gbs != mbs * dp:
        yield Hit("global_batch_size", r.shown("global_batch_size"),
                  f"global_batch_size {gbs} = {gbs / (mbs * dp):g} microbatches of "
                  f"{mbs} x DP {dp}; {why}",
                  f"set global_batch_size: {mbs * dp} or mxfp6_fused_wgrad_accum: false")


def fused_wgrad_bf16_main_grads(ctx: Context) -> Iterator[Hit]:
    r = ctx.recipe
    bf16 = r.get("use_precision_aware_optimizer") and r.get("main_grads_dtype") == "bf16"
    if fused_wgrad(r) and not bf16:
        key = "main_grads_dtype" if r.get("use_precision_aware_optimizer") \
            else "use_precision_aware_optimizer"
        yield Hit(key, r.shown(key), "mxfp6_fused_wgrad_accum writes the bf16 wgrad GEMM "
                  "output into main_grad, which must then be bf16 (precision-aware optimizer "
                  "with main_grads_dtype bf16)",
                  "set use_precision_aware_optimizer: true and main_grads_dtype: bf16")
