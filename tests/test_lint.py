"""``mxcheck lint``: every rule broken once and kept once; recipe and env parsing; the CLI.

Each rule of ``RULES`` has a case in ``CASES``: a good fixture recipe from
fixtures/recipes/, the changes that break the rule, and a near miss that keeps it. The good
fixtures themselves lint clean with their good environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mxcheck.deploy import RULES, lint, load_recipe, parse_backend_env, parse_env_file
from mxcheck.deploy.lint import SEVERITIES
from mxcheck.deploy.recipe import Recipe, recipe_from_mapping
from tests._helpers import run_cli

pytestmark = pytest.mark.emulated

RECIPES = Path(__file__).parents[1] / "fixtures" / "recipes"
DROP = object()  # a change that removes the key, so the code default applies

# The good fixtures, each with the launch environment and DP size it is meant for.
GOOD: dict[str, tuple[dict[str, str], int | None]] = {
    "flux12b_local_mxfp4": ({"PRIMUS_TURBO_GEMM_BACKEND": "FP4:AITER",
                             "PRIMUS_TURBO_AUTO_TUNE": "0"}, None),
    "flux12b_local_mxfp6": ({}, 8),
    "flux12b_local_fp8": ({"PRIMUS_TURBO_AUTO_TUNE": "1"}, None),
    "flux12b_te_mxfp4": ({}, None),
}
MXFP4, MXFP6, FP8, TE = GOOD


def variant(name: str, changes: dict[str, Any] | None = None) -> Recipe:
    """A good fixture with some keys changed (dotted keys; DROP removes one)."""
    base = load_recipe(RECIPES / f"{name}.yaml")
    values = dict(base.values)
    for key, value in (changes or {}).items():
        if value is DROP:
            values.pop(key, None)
        else:
            values[key] = value
    return Recipe(values, source=f"{name}+{changes}", model=base.model)


# rule id -> (fixture, breaking changes, breaking env or None, keeping changes, keeping env)
# The env, where given, replaces the fixture's good one; None keeps it.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, str] | None, dict[str, Any],
                       dict[str, str] | None]] = {
    "MX001": (MXFP4, {"fp4_recipe": DROP}, None, {"fp4": "nvfp4", "fp4_recipe": DROP}, None),
    "MX002": (MXFP4, {"tensor_model_parallel_size": 2}, None,
              {"tensor_model_parallel_size": 2, "transformer_impl": "transformer_engine"}, None),
    "MX003": (MXFP4, {"gradient_accumulation_fusion": DROP}, None,
              {"gradient_accumulation_fusion": False}, None),
    "MX004": (MXFP4, {"sequence_parallel": True}, None, {"sequence_parallel": False}, None),
    "MX005": (MXFP4, {"enable_primus_turbo": DROP}, None, {"enable_primus_turbo": True}, None),
    "MX006": (MXFP6, {"fp4": "mxfp4"}, None, {"fp4": None}, None),
    "MX007": (MXFP6, {"fp8": "hybrid"}, None, {"fp8": None}, None),
    "MX008": (MXFP6, {"mxfp4_to_fp8_switch_iter": 1000}, None,
              {"mxfp4_to_fp8_switch_iter": 0}, None),
    "MX009": (MXFP6, {"fp6": "mxfp6_e3m2"}, None, {"fp6": "mxfp6"}, None),
    "MX010": (MXFP6, {"mxfp6_backward_precision": "bf16"}, None,
              {"mxfp6_backward_precision": "fp8", "mxfp6_fused_wgrad_accum": False}, None),
    "MX011": (MXFP4, {"mxfp6_backward_precision": "fp8"}, None,
              {"mxfp6_backward_precision": "mxfp6"}, None),
    "MX012": (MXFP4, {"mxfp4_backward_precision": "fp6"}, None,
              {"mxfp4_backward_precision": "fp8"}, None),
    "MX013": (FP8, {"mxfp4_backward_precision": "fp8"}, None,
              {"mxfp4_backward_precision": "fp8", "fp4": "mxfp4", "fp4_recipe": "mxfp4"}, None),
    # 1 x (64 image + 256 text) tokens: the image stream's M = 64; at 256 + 256 every M tiles.
    "MX014": (MXFP6, {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 320}, None,
              {"micro_batch_size": 1, "global_batch_size": 8}, None),
    "MX015": (MXFP4, {}, {"PRIMUS_TURBO_GEMM_BACKEND": "FP4:HIPBLASLT"}, {},
              {"PRIMUS_TURBO_GEMM_BACKEND": "fp4:aiter,fp8:hipblaslt"}),
    "MX016": (MXFP4, {}, {"PRIMUS_TURBO_GEMM_BACKEND": "FP4:AITER",
                          "PRIMUS_TURBO_AUTO_TUNE": "1"}, {},
              {"PRIMUS_TURBO_GEMM_BACKEND": "FP4:AITER"}),
    "MX017": (FP8, {}, {}, {}, {"PRIMUS_TURBO_GEMM_BACKEND": "FP8:AUTOTUNE"}),
    "MX018": (FP8, {}, {"PRIMUS_TURBO_AUTO_TUNE": "1", "PRIMUS_TURBO_GEMM_BACKEND": "HIPBLASLT"},
              {}, {"PRIMUS_TURBO_AUTO_TUNE": "1", "PRIMUS_TURBO_GEMM_BACKEND": "FP4:AITER"}),
    "MX019": (MXFP4, {}, {"PRIMUS_TURBO_GEMM_BACKEND": "", "PRIMUS_TURBO_AUTO_TUNE": "0"}, {},
              {"PRIMUS_TURBO_GEMM_BACKEND": " FP4 : AITER ", "PRIMUS_TURBO_AUTO_TUNE": "0"}),
    "MX020": (TE, {"attention_backend": "flash_attn"}, None, {"attention_backend": "flash"},
              None),
    "MX021": (TE, {"torch_compile.enable": True}, None,
              {"torch_compile.enable": True, "fp4_use_native_te_autocast": False}, None),
    "MX022": (FP8, {"use_precision_aware_optimizer": False}, None,
              {"use_precision_aware_optimizer": False, "main_params_dtype": DROP,
               "main_grads_dtype": DROP, "exp_avg_dtype": DROP, "exp_avg_sq_dtype": DROP}, None),
    "MX023": (MXFP6, {"global_batch_size": 1024}, None, {"global_batch_size": DROP}, None),
    "MX024": (MXFP6, {"main_grads_dtype": "fp32"}, None,
              {"main_grads_dtype": "fp32", "mxfp6_fused_wgrad_accum": False}, None),
    "MX025": (MXFP6, {"mxfp6_backward_precision": "fp8"}, None,
              {"mxfp6_backward_precision": "fp8", "mxfp6_fused_wgrad_accum": False}, None),
}
RULE_BY_ID = {r.id: r for r in RULES}


def fired(name: str, changes: dict[str, Any], env: dict[str, str] | None) -> list[str]:
    good_env, dp = GOOD[name]
    result = lint(variant(name, changes), good_env if env is None else env, dp_size=dp)
    return [f.rule for f in result.findings]


def test_every_rule_has_a_breaking_and_a_keeping_case() -> None:
    assert sorted(CASES) == sorted(RULE_BY_ID)


def test_rule_table_is_well_formed() -> None:
    assert len(RULE_BY_ID) == len(RULES)
    for rule in RULES:
        assert rule.severity in SEVERITIES, rule.id
        assert rule.summary and callable(rule.check), rule.id


@pytest.mark.parametrize("name", GOOD)
def test_good_fixture_lints_clean_with_its_environment(name: str) -> None:
    env, dp = GOOD[name]
    result = lint(load_recipe(RECIPES / f"{name}.yaml"), env, dp_size=dp)
    assert result.findings == () and result.rules_skipped == () and result.exit_code == 0


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires_on_the_recipe_that_breaks_it(rule_id: str) -> None:
    name, changes, env, _, _ = CASES[rule_id]
    assert rule_id in fired(name, changes, env)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_is_quiet_on_the_near_miss(rule_id: str) -> None:
    name, _, _, changes, env = CASES[rule_id]
    assert rule_id not in fired(name, changes, env)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_a_finding_carries_its_rule_severity_key_and_fix(rule_id: str) -> None:
    name, changes, env, _, _ = CASES[rule_id]
    good_env, dp = GOOD[name]
    result = lint(variant(name, changes), good_env if env is None else env, dp_size=dp)
    (finding, *_) = [f for f in result.findings if f.rule == rule_id]
    assert finding.severity == RULE_BY_ID[rule_id].severity
    assert finding.key and finding.message and finding.fix
    assert result.exit_code == (1 if result.errors else 0)


def test_mxfp4_left_on_the_default_fp4_recipe_says_it_trains_nvfp4() -> None:
    (f,) = [f for f in lint(variant(MXFP4, {"fp4_recipe": DROP})).findings]
    assert (f.rule, f.key, f.value) == ("MX001", "fp4_recipe", "'nvfp4' (default)")
    assert "NVFP4" in f.message and f.fix == "set fp4_recipe: mxfp4"


def test_mxfp6_alignment_names_the_shape_and_suggests_a_micro_batch() -> None:
    changes = {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 320}
    (f,) = [f for f in lint(variant(MXFP6, changes), dp_size=8).findings if f.rule == "MX014"]
    # image M = 1 x 64; at 4 x (64, 256, 320) tokens every stream is a multiple of 256.
    assert "fwd M=64 N=9216 K=3072" in f.message
    assert "micro_batch_size 4" in f.fix


def test_mxfp6_alignment_reads_the_text_token_count() -> None:
    # One sample of 512 tokens: 256 image + 256 text tiles; 448 image + 64 text does not.
    recipe = variant(MXFP6, {"micro_batch_size": 1, "global_batch_size": 8})
    assert "MX014" not in [f.rule for f in lint(recipe, dp_size=8).findings]
    assert "MX014" in [f.rule for f in lint(recipe, dp_size=8, txt_tokens=64).findings]


def test_fused_wgrad_reads_the_dp_size_from_the_environment() -> None:
    recipe = load_recipe(RECIPES / "flux12b_local_mxfp6.yaml")
    assert [f.rule for f in lint(recipe).findings] == ["MX023"]  # DP unknown
    assert lint(recipe, {"WORLD_SIZE": "8"}).findings == ()
    assert lint(recipe, {"NNODES": "1", "GPUS_PER_NODE": "8"}).findings == ()
    (f,) = lint(recipe, {"NNODES": "2", "GPUS_PER_NODE": "8"}).findings
    assert f.rule == "MX023" and "0.5 microbatches" in f.message


def test_environment_rules_are_skipped_without_an_environment_and_listed() -> None:
    result = lint(load_recipe(RECIPES / "flux12b_local_mxfp4.yaml"))
    env_rules = sorted(r.id for r in RULES if r.needs_env)
    assert sorted(result.rules_skipped) == env_rules and env_rules
    assert not set(result.rules_run) & set(env_rules)
    assert "pass --env or --env-file" in result.to_text()


@pytest.mark.parametrize(("value", "expected"), [
    ("AITER", {"FP4": "AITER", "FP8": "AITER", "BF16": "AITER"}),
    ("FP4:AITER", {"FP4": "AITER", "FP8": None, "BF16": None}),
    ("fp4:aiter, other:hipblaslt", {"FP4": "AITER", "FP8": "HIPBLASLT", "BF16": "HIPBLASLT"}),
    ("FP8:autotune,FP16:CK", {"FP4": None, "FP8": "AUTOTUNE", "BF16": "CK"}),
])
def test_backend_env_parses_as_primus_turbo_reads_it(value: str,
                                                     expected: dict[str, str | None]) -> None:
    assert parse_backend_env(value) == expected


@pytest.mark.parametrize(("value", "needle"), [
    ("", "is empty"), ("  ", "is empty"), ("AITR", "'AITR'"), ("FP4:AITR", "'AITR'"),
    ("FP4:AITER,FP6:CK", "precision 'FP6'"), ("FP4=AITER,fp8", "not PRECISION:BACKEND"),
    # No precision keyword, so Primus-Turbo reads the whole value as one backend name.
    ("FP6:AITER", "backend 'FP6:AITER'"),
])
def test_backend_env_rejects_what_primus_turbo_raises_on(value: str, needle: str) -> None:
    with pytest.raises(ValueError, match="PRIMUS_TURBO_GEMM_BACKEND") as e:
        parse_backend_env(value)
    assert needle in str(e.value)


def test_a_malformed_backend_value_is_mx019_not_a_crash() -> None:
    result = lint(load_recipe(RECIPES / "flux12b_local_mxfp4.yaml"),
                  {"PRIMUS_TURBO_GEMM_BACKEND": "FP4:AITR"})
    assert [f.rule for f in result.findings] == ["MX019"]


def test_env_file_takes_export_quotes_and_comments() -> None:
    text = "# launch env\nexport PRIMUS_TURBO_GEMM_BACKEND='FP4:AITER'\n\nA=\"x y\"\nB=\n"
    assert parse_env_file(text) == {"PRIMUS_TURBO_GEMM_BACKEND": "FP4:AITER", "A": "x y", "B": ""}


def test_env_file_names_the_bad_line() -> None:
    with pytest.raises(ValueError, match=r"env file e\.env line 2: expected KEY=VALUE"):
        parse_env_file("A=1\nnot a pair\n", source="e.env")


def test_placeholders_resolve_to_the_env_else_the_default() -> None:
    data = {"modules": {"pre_trainer": {"model": "diffusion/flux_535m.yaml", "overrides": {
        "seed": "${PRIMUS_SEED:2025}", "fp4_recipe": "${RECIPE:nvfp4}", "path": "/d/${USER:me}/x",
        "torch_compile": {"enable": True}}}}}
    plain = recipe_from_mapping(data)
    assert (plain.get("seed"), plain.get("fp4_recipe"), plain.get("path")) == (2025, "nvfp4",
                                                                             "/d/me/x")
    assert plain.get("torch_compile.enable") is True and plain.model == "flux-535m"
    env = recipe_from_mapping(data, env={"PRIMUS_SEED": "7", "RECIPE": "mxfp4", "USER": "ci"})
    assert (env.get("seed"), env.get("fp4_recipe"), env.get("path")) == (7, "mxfp4", "/d/ci/x")


def test_a_flat_recipe_and_its_defaults() -> None:
    r = recipe_from_mapping({"fp4": "mxfp4"})
    assert r.is_set("fp4") and not r.is_set("fp4_recipe")
    assert r.get("fp4_recipe") == "nvfp4" and r.shown("fp4_recipe") == "'nvfp4' (default)"
    assert r.get("gradient_accumulation_fusion") is True and r.model == "flux-12b"


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(TypeError, match="expected a mapping"):
        recipe_from_mapping(["fp4"])
    with pytest.raises(ValueError, match="overrides"):
        recipe_from_mapping({"modules": {"pre_trainer": {"framework": "megatron"}}})
    with pytest.raises(TypeError, match="recipe="):
        lint({"fp4": "mxfp4"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="txt_tokens=0"):
        lint(recipe_from_mapping({}), txt_tokens=0)
    with pytest.raises(ValueError, match="dp_size=True"):
        lint(recipe_from_mapping({}), dp_size=True)


# ---- the command ---------------------------------------------------------------------


def test_cli_exit_1_on_errors_with_every_finding_in_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "lint", RECIPES / "bad_mxfp4_local_defaults.yaml", "--json")
    data = json.loads(out)
    assert (code, err) == (1, "")
    assert [f["rule"] for f in data["findings"]] == ["MX001", "MX003", "MX005"]
    assert (data["errors"], data["warnings"], data["env_checked"]) == (3, 0, False)
    assert set(data["findings"][0]) == {"rule", "severity", "key", "value", "message", "fix"}


def test_cli_text_lists_rule_severity_key_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "lint", RECIPES / "bad_mxfp6_fp8_unaligned.yaml")
    assert code == 1
    assert "2 error(s), 1 warning(s)" in out.splitlines()[0]
    assert "MX007 error   fp8 = 'e4m3'" in out and "MX022 warning main_grads_dtype" in out
    assert "fix: drop fp8" in out


def test_cli_warnings_only_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "lint", RECIPES / "warn_only_inert_dtypes.yaml", "--json")
    data = json.loads(out)
    assert (code, data["errors"], [f["rule"] for f in data["findings"]]) == (0, 0, ["MX022"])


def test_cli_env_file_runs_the_environment_rules(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    env = tmp_path / "launch.env"
    env.write_text("export PRIMUS_TURBO_GEMM_BACKEND=FP4:AITER\nPRIMUS_TURBO_AUTO_TUNE=1\n")
    recipe = RECIPES / "flux12b_local_mxfp4.yaml"
    code, out, _ = run_cli(capsys, "lint", recipe, "--env-file", env, "--json")
    data = json.loads(out)
    assert (code, data["env_checked"], [f["rule"] for f in data["findings"]]) == (1, True,
                                                                                  ["MX016"])
    env.write_text("PRIMUS_TURBO_GEMM_BACKEND=FP4:AITER\n")
    assert run_cli(capsys, "lint", recipe, "--env-file", env)[0] == 0


def test_cli_env_reads_this_process_environment(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMUS_TURBO_GEMM_BACKEND", "")
    monkeypatch.delenv("PRIMUS_TURBO_AUTO_TUNE", raising=False)
    code, out, _ = run_cli(capsys, "lint", RECIPES / "flux12b_local_mxfp4.yaml", "--env", "--json")
    rules = [f["rule"] for f in json.loads(out)["findings"]]
    assert code == 1 and "MX019" in rules


def test_cli_dp_size_decides_the_microbatch_rule(capsys: pytest.CaptureFixture[str]) -> None:
    recipe = RECIPES / "flux12b_local_mxfp6.yaml"
    assert run_cli(capsys, "lint", recipe, "--dp-size", "8")[0] == 0
    code, out, _ = run_cli(capsys, "lint", recipe, "--dp-size", "4")
    assert code == 1 and "MX023" in out and "2 microbatches" in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["lint", RECIPES / "no_such_recipe.yaml"], "cannot read recipe"),
    (["lint", RECIPES / "not_a_mapping.yaml"], "expected a mapping of keys, got list"),
    (["lint", RECIPES / "flux12b_local_mxfp4.yaml", "--env-file", RECIPES / "missing.env"],
     "cannot read env file"),
    (["lint", RECIPES / "flux12b_local_mxfp4.yaml", "--dp-size", "0"], "dp-size"),
    (["lint", RECIPES / "flux12b_local_mxfp4.yaml", "--env", "--env-file", "x"], "not allowed"),
])
def test_cli_bad_usage_or_input_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                                        argv: list[Any], needle: str) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and "error: " in err and needle in err


def test_cli_not_yaml_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("fp4: [mxfp4\n")
    code, _, err = run_cli(capsys, "lint", bad)
    assert code == 2 and len(err.splitlines()) == 1 and "not valid YAML" in err


def test_cli_bad_env_file_line_is_exit_2(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    env = tmp_path / "e.env"
    env.write_text("A=1\n???\n")
    code, _, err = run_cli(capsys, "lint", RECIPES / "flux12b_local_mxfp4.yaml", "--env-file", env)
    assert code == 2 and "line 2" in err


# ---- files a linter must refuse quickly and clearly --------------------------------------


def alias_bomb(levels: int, width: int = 9) -> str:
    """The "billion laughs" YAML: each level is ``width`` aliases of the one before, so the
    expanded document has about width**levels nodes in a few hundred bytes."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]"
              for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_by_counting_each_shared_node_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mxcheck.deploy import recipe as recipe_module

    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9), encoding="utf-8")  # 9**9 = 387,420,489 expanded nodes
    visits = [0]  # a count, not the nodes: a node's repr would print the expanded bomb
    children = recipe_module._node_children

    def counting(node: Any) -> Any:
        visits[0] += 1
        return children(node)

    monkeypatch.setattr(recipe_module, "_node_children", counting)
    with pytest.raises(ValueError, match=rf"^recipe {path}: its aliases expand to more than "
                                         r"100,000 YAML nodes \(a 'billion laughs' alias bomb\?\)"):
        load_recipe(path)
    # The file has 28 nodes (the root, 9 keys, 9 lists, 9 strings): each is looked at at
    # most once, where expanding would look at 100,000 before giving up.
    assert 0 < visits[0] <= 28


def test_anchors_and_aliases_within_the_bound_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("common: &c {fp4: e2m1}\nmodules:\n  pre_trainer:\n    overrides:\n"
                    "      <<: *c\n      fp4_recipe: mxfp4\n      extra: [*c, *c]\n", encoding="utf-8")
    r = load_recipe(path)
    assert (r.get("fp4"), r.get("fp4_recipe"), r.values["extra"]) == (
        "e2m1", "mxfp4", [{"fp4": "e2m1"}, {"fp4": "e2m1"}])
    path.write_text(alias_bomb(5), encoding="utf-8")  # 9**5 = 59,049 nodes: under the bound
    assert load_recipe(path).values["l4"][0][0][0][0][0] == "lol"


def test_a_recipe_that_refers_to_itself_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "self.yaml"
    path.write_text("fp4: mxfp4\ntorch_compile: &t\n  enable: false\n  again: *t\n",
                    encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^recipe {path}: line 2: an anchor contains an "
                                         "alias to itself"):
        load_recipe(path)
    looped: dict[str, Any] = {"fp4": "mxfp4", "torch_compile": {}}
    looped["torch_compile"]["again"] = looped["torch_compile"]  # built in Python, no YAML
    with pytest.raises(ValueError, match=r"^recipe <recipe>: torch_compile.again contains itself"):
        recipe_from_mapping(looped)


def test_a_deeply_nested_recipe_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("fp4: " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^recipe {path}: nested too deeply to read"):
        load_recipe(path)


@pytest.mark.parametrize(("text", "needle"), [
    (alias_bomb(9), "alias bomb"),
    ("a: &a [*a]\n", "line 1: an anchor contains an alias to itself"),
    ("a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n", "nested too deeply"),
], ids=["alias-bomb", "self-reference", "deep"])
def test_cli_refuses_each_bad_recipe_with_exit_2_and_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    code, out, err = run_cli(capsys, "lint", path)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(f"mxcheck lint: error: recipe {path}: ")
    assert needle in err
