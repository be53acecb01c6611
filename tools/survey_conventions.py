"""The survey: each quantization library's conventions and defects, per release, as mxcheck sees them.

Libraries are data (``LIBRARIES``): the mxcheck adapter that drives the library, the
distribution whose version is the release, the recipes to fit, the devices, and the
conformance checks to run. For each library x release x device the tool runs, in a child
process where that release is importable:

* ``mxcheck fit`` (``fit_backend`` on the quantize check's inputs, operand x_row) on every
  recipe: the profile that reproduces the library's quantizer and the blocks left over;
* ``mxcheck conform`` (the installed suite) on the same recipes, summarised per check;
* every committed reproducer of the library's defects (``references/conventions/LIBRARY/*.py``,
  each exits 1 while its defect is there), so a release that fixes one shows it.

The records go to ``references/conventions/LIBRARY.json`` (one run per release and device,
merged with the runs already recorded; the defects, written by hand with the effect in a
sentence and the library line that causes it, are kept) and the page ``docs/conventions.md``
is generated from every record there.

A release is chosen by the interpreter that runs the child (``--python``: a venv holding that
release, repeatable) or by a ``--installs`` directory holding ``PACKAGE-VERSION`` folders made
with ``pip install --no-deps --target DIR/PACKAGE-VERSION PACKAGE==VERSION``::

    python tools/survey_conventions.py --library compressed_tensors --python /work/venv-ct-A/bin/python
    python tools/survey_conventions.py --library torchao --installs /tmp/fit      # every torchao-X there
    python tools/survey_conventions.py --library transformer_engine --device cuda --out DIR   # on the GPU
    python tools/survey_conventions.py --page-only                                 # regenerate the page

``--out DIR`` writes the records under DIR instead of ``references/conventions`` (copy them
back to merge a GPU run); ``--interop PY`` measures the interop matrix with an interpreter that
imports every exporting library.

One file (over the house's 400 lines) because it is one script run in three roles: the parent,
the child it starts under each release's interpreter (``--child``, ``--interop-child``: the
same file, so no import path is needed there) and the page's writer.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RECORDS = ROOT / "references" / "conventions"
PAGE = ROOT / "docs" / "conventions.md"


@dataclass(frozen=True)
class Library:
    """One surveyed library.

    ``recipes`` (fitted) and ``conform`` (judged by ``mxcheck conform``): what
    ``mxcheck.recipe_files.resolve_recipe`` takes (a name, RECIPE@PROFILE, a recipe file), or
    ``mx:FMT:RULE`` (one MX element format and scale rule on every operand copy, 1x32 blocks).
    Fits are made on plain recipes, so that a cell shows every convention; ``conform`` empty
    means the adapter's ``claims`` (pinned to the profiles it declares). ``checks``: a pytest
    ``-k`` expression choosing the conformance checks ("" runs all of them)."""

    name: str
    adapter: str
    packages: tuple[str, ...]  # distribution names; the first installed gives the release
    recipes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ("cpu",)
    conform: tuple[str, ...] = ()
    checks: str = ""
    exports_codes: bool = False  # its quantize() returns the codes it exports (the interop matrix's rows)
    notes: str = ""


_MX_GRID = tuple(f"mx:{fmt}:{rule}" for fmt in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")
                 for rule in ("floor", "ceil", "even", "rceil"))

LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (
    Library("torchao", "torchao", ("torchao",), _MX_GRID, ("cpu", "cuda"), checks="quantize",
            exports_codes=True, notes="to_mx on every element format and scale rule it takes"),
    Library("transformer_engine", "transformer_engine", ("transformer-engine", "transformer_engine",
                                                          "transformer-engine-torch"),
            (), ("cuda",), conform=("fp8", "fp8-hybrid", "fp8-delayed", "fp8-block", "mxfp8", "nvfp4"),
            notes="te.pytorch.Linear under autocast: no quantizer to fit, the linear checks only"),
    Library("aiter_triton", "aiter_triton", ("amd-aiter",), ("mxfp4-1x32",), ("cuda",),
            conform=("mxfp4-1x32",), exports_codes=True, notes="dynamic_mxfp4_quant and gemm_afp4wfp4 (Triton)"),
    Library("compressed_tensors", "compressed_tensors", ("compressed-tensors",),
            ("nvfp4-1x16", "mxfp4-1x32", "mx:e4m3:even", "fp8-tensorwise"), exports_codes=True,
            notes="preset schemes NVFP4, MXFP4, MXFP8A16 and FP8: generate_gparam, compute_dynamic_scales_and_zp, "
                  "then quantize / fake_quantize and the compressors' packers"),
    Library("modelopt", "modelopt", ("nvidia-modelopt",),
            ("nvfp4-1x16", "mxfp8", "mx:e2m1:rceil", "fp8-tensorwise"), exports_codes=True,
            notes="NVFP4QTensor, MXFP8QTensor, MXFP4QTensor and FP8QTensor quantize / dequantize (the export), "
                  "scaled_e4m3 (QAT fake-quant, FP8)"),
    # fake-quant only (values, no codes): `mxcheck fit` takes a quantizer that returns codes, so
    # these two are judged by the conformance check on values (-k quantize runs check_quantize,
    # which judges fake_quantize where a backend has no quantize)
    Library("brevitas", "brevitas", ("brevitas",),
            ("ocp-mxfp8-e4m3", "ocp-mxfp8-e5m2", "ocp-mxfp6-e2m3", "ocp-mxfp4", "fp8-tensorwise"),
            conform=("ocp-mxfp8-e4m3", "ocp-mxfp8-e5m2", "ocp-mxfp6-e2m3", "ocp-mxfp4", "fp8-tensorwise"),
            checks="quantize",
            notes="QuantIdentity(act_quant=MXFloat8e4m3Act.let(widths), group_dim=-1) and QuantLinear with "
                  "Fp8e4m3OCPWeightPerTensorFloat: the values of the QuantTensor they return"),
    Library("quark", "quark", ("amd-quark",),
            ("mx:e4m3:even", "ocp-mxfp8-e4m3", "ocp-mxfp4", "fp8-tensorwise", "nvfp4-1x16"),
            conform=("mx:e4m3:even", "ocp-mxfp8-e4m3", "mxfp4-1x32", "ocp-mxfp4", "fp8-tensorwise", "nvfp4-1x16"),
            checks="quantize",
            notes="FakeQuantizeBase.get_fake_quantize of its OCP_MX*Spec (scale_calculation_mode even, Quark's "
                  "default, and floor), FP8E4M3PerTensorSpec and the nvfp4 scheme's two-stage spec, eager "
                  "(QUARK_DISABLE_COMPILE=1)"),
)}


# ---- the child: runs where one release is importable ----------------------------------------

def _release(lib: Library) -> str | None:
    for package in lib.packages:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return None


def _recipe(claim: str) -> Any:
    from mxcheck.recipe_files import resolve_recipe  # noqa: PLC0415
    from mxcheck.recipes import OPERANDS, OperandSpec, Recipe  # noqa: PLC0415

    if claim.startswith("mx:"):
        _, fmt, rule = claim.split(":")
        return Recipe(claim, **dict.fromkeys(OPERANDS, OperandSpec(fmt, "mx", scale_rule=rule)),
                      source=f"survey: MX {fmt} with scale rule {rule} on every operand copy")
    return resolve_recipe(claim)


def _fit(backend: Any, recipe: Any) -> dict[str, Any]:
    from mxcheck.backends.contract import Refusal  # noqa: PLC0415
    from mxcheck.conformance.fitting import fit_backend  # noqa: PLC0415

    if not (hasattr(backend, "quantize") or hasattr(backend, "fake_quantize")):
        return {"recipe": recipe.name, "not_run": "the adapter has no quantizer (quantize or fake_quantize)"}
    start = time.process_time()
    try:
        (found,) = fit_backend(backend, recipe, operands=("x_row",))
    except Refusal as e:
        return {"recipe": recipe.name, "refused": str(e)}
    except Exception as e:  # a library crash on the fit's inputs is a finding, not the end of the survey
        return {"recipe": recipe.name, "error": f"{type(e).__name__}: {e}"[:400]}
    f = found.fit
    if f is None:
        return {"recipe": recipe.name, "not_run": "profiles cannot model this spec"}
    return {"recipe": recipe.name, "fields": f.fields, "failures": [b.key for b in f.failures],
            "residual": f.residual, "blocks": f.blocks, "registered": _registered(f.profile("fit"), found.spec.fmt),
            "residual_by_input": {k: v for k, v in f.residual_by_case if v},
            "text": f.text(recipe.name), "cpu_s": round(time.process_time() - start, 2)}


def _registered(fitted: Any, fmt: str) -> str:
    """The registered profile the fit equals (every field but name, source and notes), or ""."""
    from mxcheck.diagnose.fit import profile_fields  # noqa: PLC0415
    from mxcheck.profiles import ALL_PROFILES  # noqa: PLC0415

    want = {**profile_fields(fitted), "fmt": fmt}
    return next((name for name, p in ALL_PROFILES.items()
                 if type(p) is type(fitted) and p.fmt in (None, fmt) and {**profile_fields(p), "fmt": fmt} == want), "")


def _conform(lib: Library, claims: list[str], work: Path) -> dict[str, Any]:
    """``mxcheck conform`` on the recipes, summarised: per check, records passed / failed and
    the first failing record's message."""
    report = work / f"{lib.name}-conform.json"
    args = [sys.executable, "-m", "mxcheck", "conform", "--backend", lib.adapter, "--report", str(report)]
    for c in claims:
        args += ["--recipe", c]
    plugin = [] if any(ep.name == "mxcheck" for ep in metadata.entry_points(group="pytest11")) else [
        "-p", "mxcheck.plugin"]  # mxcheck on PYTHONPATH only, not installed: no entry point loads the plugin
    args += ["--", "-q", "-p", "no:cacheprovider", *plugin] + (["-k", lib.checks] if lib.checks else [])
    start = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    out: dict[str, Any] = {"exit": proc.returncode, "seconds": round(time.monotonic() - start, 1),
                           "tail": proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []}
    if not report.exists():
        out["error"] = (proc.stderr or proc.stdout)[-600:]
        return out
    data = json.loads(report.read_text())
    checks: dict[str, dict[str, Any]] = {}
    for r in data["records"]:
        name = f"{r['recipe']} {r['test_id'].rsplit('-', 1)[-1].rstrip(']')}"
        c = checks.setdefault(name, {"passed": 0, "failed": 0})
        c["passed" if r["passed"] else "failed"] += 1
        if not r["passed"] and "first_failure" not in c:
            c["first_failure"] = r["message"][:300]
    out["checks"] = checks
    out["skipped"] = len(data.get("skipped", []))
    return out


def reproducer_files(library: str) -> list[Path]:
    """The committed reproducers of a library's defects (``_*.py`` are their shared helpers)."""
    return sorted(p for p in (RECORDS / library).glob("*.py") if not p.name.startswith("_"))


def defects(library: str) -> list[dict[str, str]]:
    """Each reproducer's defect, from its docstring: the title line, and the ``effect:``,
    ``cause:`` and ``recipe:`` lines (written by hand, each checked against the library's code)."""
    out = []
    for path in reproducer_files(library):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        fields = dict(line.split(": ", 1) for line in doc.splitlines()[1:] if line.split(":")[0] in _DEFECT_FIELDS)
        missing = [f for f in _DEFECT_FIELDS if f not in fields]
        if missing:
            raise ValueError(f"reproducer {path}: its docstring has no {', '.join(missing)} line")
        out.append({"id": path.stem, "title": doc.splitlines()[0], **fields})
    return out


_DEFECT_FIELDS = ("effect", "cause", "recipe")


def _reproducers(lib: Library) -> dict[str, int]:
    """Each committed reproducer's exit status on this release (1: the defect is there)."""
    out = {}
    for path in reproducer_files(lib.name):
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, check=False)
        out[path.stem] = proc.returncode
    return out


def _child(lib: Library, device: str, out: Path) -> None:
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)  # many small quantizations: threads only wait on each other
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: torch {torch.__version__} sees no CUDA device")
    from mxcheck import backends  # noqa: PLC0415

    backend = backends.get(lib.adapter)
    ok, why = backend.available()
    run: dict[str, Any] = {"release": _release(lib), "torch": torch.__version__, "device": device,
                           "date": time.strftime("%Y-%m-%d", time.gmtime())}
    if not ok:
        out.write_text(json.dumps({**run, "unavailable": str(why)}, indent=1))
        return
    start = time.monotonic()
    run["fits"] = [_fit(backend, _recipe(c)) for c in lib.recipes]
    with tempfile.TemporaryDirectory() as tmp:
        # grid recipes reach the conform CLI as recipe files
        claims = [str(_recipe_file(_recipe(c), Path(tmp))) if c.startswith("mx:") else c for c in lib.conform]
        run["conform"] = _conform(lib, claims, Path(tmp))
    run["reproducers"] = _reproducers(lib)
    run["seconds"] = round(time.monotonic() - start, 1)
    out.write_text(json.dumps(run, indent=1, default=str))


def _recipe_file(recipe: Any, where: Path) -> Path:
    spec = recipe.spec("x_row")
    path = where / f"{recipe.name.replace(':', '-')}.yaml"
    path.write_text(f"name: {recipe.name.replace(':', '-')}\nall: {{fmt: {spec.fmt}, scaling: mx, "
                    f"scale_rule: {spec.scale_rule}}}\n")
    return path


# ---- interop: one library's exported codes read by another's dequantization ---------------------

ORACLE = "the format's definition (mxcheck)"


def _interop_inputs(spec: Any, dtypes: tuple) -> list[Any]:
    """The quantize check's inputs for ``spec`` (every family, in each dtype the exporter takes)."""
    import torch  # noqa: PLC0415

    from mxcheck.conformance.basic import QUANTIZE_INPUTS  # noqa: PLC0415

    gen = torch.Generator().manual_seed(0)
    return [t for family in QUANTIZE_INPUTS.values() for dtype, _, t in family.tensors(gen, spec, 256, 512)
            if dtype in dtypes]


def _definition(q: Any) -> Any:
    """The values an export's fields mean by the format's definition: NVFP4 code x block scale
    x the exported per-tensor decode factor; MX and FP8 as mxcheck's tensors dequantize."""
    return q.block_values() * q.tensor_scale if hasattr(q, "block_scales") else q.dequantize()


def _interop_child(out: Path) -> None:
    """Per exporting library and claim: for each other library that reads that format, how
    many values of its dequantization of the exported codes differ from the exporter's own
    values (both rounded to bfloat16, the dtype a model is served in; NaN equals NaN)."""

    from mxcheck import backends  # noqa: PLC0415
    from mxcheck.backends.contract import Refusal  # noqa: PLC0415

    here = {}
    for lib in LIBRARIES.values():
        backend = backends.get(lib.adapter)
        if lib.exports_codes and backend.available()[0]:
            here[lib.name] = backend
    readers = {n: b for n, b in here.items() if hasattr(b, "dequantize")}

    def differ(a: Any, b: Any) -> int:
        a, b = a.float().bfloat16(), b.float().bfloat16()
        return int(((a != b) & ~(a.isnan() & b.isnan())).sum())

    result: dict[str, Any] = {"releases": {n: _release(LIBRARIES[n]) for n in here}, "matrix": {}}
    for name, exporter in here.items():
        if not hasattr(exporter, "fake_quantize"):
            continue  # its own values are the reference
        for claim in exporter.claims:
            spec = claim.spec("x_row")
            cells, crashes, total = {}, {}, 0
            for x in _interop_inputs(spec, tuple(getattr(exporter, "input_dtypes", ()))):
                try:
                    own, q = exporter.fake_quantize(x, spec), exporter.quantize(x, spec)
                except Refusal:
                    continue
                total += x.numel()
                reads = {ORACLE: lambda q=q: _definition(q)}
                for reader_name, reader in readers.items():
                    same_format = [c.spec("x_row") for c in reader.claims if (c.x_row.fmt, c.x_row.scaling,
                                   c.x_row.block_size) == (spec.fmt, spec.scaling, spec.block_size)]
                    if reader_name != name and same_format:
                        reads[reader_name] = lambda q=q, r=reader, s=same_format[0]: r.dequantize(q, s)
                for k, read in reads.items():
                    try:
                        n = differ(read(), own)
                    except Exception as e:  # a reader that cannot read an export is a finding
                        crashes.setdefault(k, f"cannot read it: {type(e).__name__}: {str(e)[:80]}")
                        continue
                    cells[k] = cells.get(k, 0) + n
            result["matrix"][f"{name} {claim.name}"] = {
                k: crashes.get(k) or ("same" if cells[k] == 0 else f"{cells[k]:,} of {total:,} differ")
                for k in {**cells, **crashes}}
    out.write_text(json.dumps(result, indent=1))


def interop(python: str, records: Path) -> None:
    """Run the interop matrix where ``python`` imports the exporting libraries; store each
    exporter's row in its record."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "interop.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run([python, __file__, "--interop-child", str(out)], env=env, check=True)
        result = json.loads(out.read_text())
    for name in result["releases"]:
        path = records / f"{name}.json"
        record = json.loads(path.read_text()) if path.exists() else {"library": name, "runs": [], "defects": []}
        records.mkdir(parents=True, exist_ok=True)
        record["interop"] = {"releases": result["releases"],
                             "rows": {k: v for k, v in result["matrix"].items() if k.split(" ")[0] == name}}
        path.write_text(json.dumps(record, indent=1, default=str) + "\n")


# ---- the parent: one child per release, then the records and the page -----------------------

def _children(lib: Library, device: str, pythons: list[str], installs: Path | None) -> list[tuple[str, dict]]:
    """(python, extra PYTHONPATH entries) per release to run."""
    if installs is None:
        return [(py, {}) for py in (pythons or [sys.executable])]
    dirs = [d for p in lib.packages for d in installs.glob(f"{p.replace('-', '_')}-*")]
    dirs += [d for p in lib.packages for d in installs.glob(f"{p}-*") if d not in dirs]
    return [(pythons[0] if pythons else sys.executable, {"dir": str(d)}) for d in sorted(dirs) if d.is_dir()]


def survey(lib: Library, device: str, pythons: list[str], installs: Path | None, records: Path) -> dict:
    """Run the library on each release here and merge the runs into its record file."""
    path = records / f"{lib.name}.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    record.update({"library": lib.name, "adapter": lib.adapter, "packages": list(lib.packages)})
    record.setdefault("runs", [])
    record["defects"] = defects(lib.name)
    for python, extra in _children(lib, device, pythons, installs):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run.json"
            # the release's folder and this checkout first; the caller's PYTHONPATH after them (on the
            # GPU machine it holds the carried packages' dist-info, where the release is read)
            outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            path_entries = [p for p in (extra.get("dir"), str(ROOT), *outer) if p]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path_entries), "OMP_NUM_THREADS": "1"}
            if device == "cpu":
                env["CUDA_VISIBLE_DEVICES"] = ""  # a GPU host's adapters would otherwise pick cuda
            print(f"surveying {lib.name} on {device} with {python} {extra.get('dir', '')} ...", flush=True)
            subprocess.run([python, __file__, "--child", str(out), "--library", lib.name, "--device", device],
                           env=env, check=True)
            run = json.loads(out.read_text())
        record["runs"] = [r for r in record["runs"]
                          if (r["release"], r["device"]) != (run["release"], run["device"])] + [run]
        record["runs"].sort(key=lambda r: (r["device"], _version_key(r["release"] or "0")))
        print(f"  {lib.name} {run['release']} ({device}): {run.get('seconds', 0)} s", flush=True)
    records.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in v.replace("+", ".").split("."))


# ---- the page ---------------------------------------------------------------------------------

def _value(v: object) -> str:
    if isinstance(v, float) and v > 0 and math.frexp(v)[0] == 0.5:
        return f"2^{math.frexp(v)[1] - 1}"
    return f"{v!r}" if isinstance(v, str) else str(v)


def _cell(fit: dict | None) -> str:
    if fit is None:
        return "not run"
    for why in ("refused", "not_run", "error"):
        if why in fit:
            return f"{why.replace('_', ' ')}: {fit[why]}"[:160]
    parts = [f"{k}={_value(v)}" for k, v in fit["fields"].items()] + [f"failure {k}" for k in fit["failures"]]
    tail = "" if not fit["residual"] else f" + residual {fit['residual']:,} of {fit['blocks']:,}"
    same = "" if fit["failures"] or not fit["fields"] else fit.get("registered", "")
    return (", ".join(parts) or "as the recipe declares") + (f" (= `{same}`)" if same else "") + tail


def _conform_cell(run: dict, recipe: str) -> str:
    conform = run.get("conform", {})
    if "error" in conform:
        return "did not run"
    mine = {k.split(" ", 1)[1]: v for k, v in conform.get("checks", {}).items() if k.split(" ", 1)[0] == recipe}
    if not mine:
        return "not run"
    failed = sorted(k for k, v in mine.items() if v["failed"])
    return "passes" if not failed else "fails " + ", ".join(failed)


def _table(first: str, rows: list[str], heads: list[str], cell: Any) -> list[str]:
    lines = [f"| {first} | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(cell(row, i).replace("|", "\\|") for i in range(len(heads))) + " |")
    return [*lines, ""]


def _library_section(rec: dict) -> list[str]:
    lib = LIBRARIES.get(rec["library"])
    runs = [r for r in rec["runs"] if "unavailable" not in r]
    lines = [f"## {rec['library']}", ""]
    if lib is not None and lib.notes:
        lines += [f"Adapter `{rec['adapter']}`: {lib.notes}.", ""]
    lines += [f"Not runnable: {r['release']} ({r['device']}): {r['unavailable']}" for r in rec["runs"]
              if "unavailable" in r]
    if not runs:
        return [*lines, "", "No release was run yet.", ""]
    heads = [f"{r['release']} ({r['device']})" for r in runs]
    lines += [f"{h}: {r['note']}." for h, r in zip(heads, runs, strict=True) if r.get("note")]
    lines += [""] if any(r.get("note") for r in runs) else []
    fits = list(dict.fromkeys(f["recipe"] for r in runs for f in r.get("fits", [])))
    if fits:
        lines += ["Fitted profile (`mxcheck fit`, operand x_row):", ""]
        lines += _table("recipe", fits, heads, lambda recipe, i: _cell(
            next((f for f in runs[i].get("fits", []) if f["recipe"] == recipe), None)))
    claims = list(dict.fromkeys(k.split(" ", 1)[0] for r in runs for k in r.get("conform", {}).get("checks", {})))
    if claims:
        lines += ["Conformance (`mxcheck conform` on " + ("the adapter's claims" if lib is None or not lib.conform
                                                          else "these recipes") + "):", ""]
        lines += _table("claim", claims, heads, lambda claim, i: _conform_cell(runs[i], claim))
    timed = [f"{h} {r['seconds']} s" for h, r in zip(heads, runs, strict=True) if "seconds" in r]
    lines += [f"Survey time (wall, on a shared 2-core machine): {', '.join(timed)}.", ""] if timed else []
    if rec["defects"]:
        lines += [f"Defects (reproducers: `references/conventions/{rec['library']}/DEFECT.py`, one block each, exit 1 "
                  "while the defect is there):", "",
                  "| defect | effect | cause (in the library's source) | recipe | " + " | ".join(heads) + " |",
                  "|---|---|---|---|" + "---|" * len(runs)]
        for d in rec["defects"]:
            seen = [{1: "yes", 0: "fixed"}.get(r.get("reproducers", {}).get(d["id"]), "not run") for r in runs]
            link = f"`{d['id']}`"
            lines.append(f"| {link} | {d['effect']} | {d['cause']} | {d['recipe']} | " + " | ".join(seen) + " |")
        lines.append("")
    return lines


def _interop(records: list[dict]) -> list[str]:
    rows = {k: v for r in records for k, v in r.get("interop", {}).get("rows", {}).items()}
    if not rows:
        return []
    releases = {k: v for r in records for k, v in r.get("interop", {}).get("releases", {}).items()}
    readers = [ORACLE, *sorted({reader for cells in rows.values() for reader in cells} - {ORACLE})]
    lines = ["## Interop: one library's codes read by another", "",
             "A row is a library's export (its quantizer's codes and scales, for one of its configurations); a "
             "column is a dequantization of those codes: the format's definition (the codes' values times the "
             "exported scales, as mxcheck's tensors decode them), or another library's own dequantization of that format (its decompressor), given "
             "the codes and scales converted to the fields its checkpoints hold. *same*: every value equals "
             "the exporter's own values (its fake-quant), both rounded to bfloat16 (NaN equals NaN), on the "
             "quantize check's inputs (every input family, in each dtype the exporter takes); "
             "otherwise how many differ. Releases: "
             + ", ".join(f"{k} {v}" for k, v in sorted(releases.items())) + ".", ""]
    lines += _table("export", sorted(rows), readers, lambda row, i: rows[row].get(
        readers[i], "(its own)" if readers[i] == row.split(" ")[0] else "n/a"))
    return lines


def page(records: list[dict]) -> str:
    lines = ["# Which conventions each library uses", "",
             "Generated by `tools/survey_conventions.py` from `references/conventions/*.json`. Per library, "
             "release and device: `mxcheck fit` (the profile that reproduces the library's quantizer on the "
             "quantize check's inputs, operand x_row) and `mxcheck conform` on each recipe. A cell is the fitted "
             "profile: the fields that differ from what the recipe declares, the failures no profile field "
             "states and the blocks left unexplained; *as the recipe declares* where the library agrees with "
             "it, and a registered profile's name where the fit equals one. Then the conformance checks that "
             "fail. Each defect was checked by hand against the library's code; its reproducer under "
             "`references/conventions/LIBRARY/` exits 1 while the defect is there.", ""]
    for rec in records:
        lines += _library_section(rec)
    lines += _interop(records)
    not_run = [n for n in LIBRARIES if n not in {r["library"] for r in records}]
    if not_run:
        lines += [f"Not surveyed yet: {', '.join(not_run)} (on a GPU: `python tools/survey_conventions.py --library "
                  "NAME --device cuda --out DIR`, then the records copied into `references/conventions/`).", ""]
    return "\n".join(lines)


def _records(where: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(where.glob("*.json"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--library", action="append", choices=sorted(LIBRARIES), default=[],
                    help="library to survey (repeatable). Default: none (with --page-only) ")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="Default: %(default)r")
    ap.add_argument("--python", action="append", default=[], metavar="PY",
                    help="an interpreter holding one release (repeatable). Default: this one")
    ap.add_argument("--installs", type=Path, help="a directory of PACKAGE-VERSION --target installs")
    ap.add_argument("--out", type=Path, default=RECORDS, help="where the records go. Default: %(default)s")
    ap.add_argument("--page-only", action="store_true", help="regenerate the page from the records")
    ap.add_argument("--interop", metavar="PY", help="measure the interop matrix with this interpreter (one that "
                    "imports every exporting library)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--interop-child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(LIBRARIES[args.library[0]], args.device, args.child)
        return 0
    if args.interop_child:
        _interop_child(args.interop_child)
        return 0
    for name in args.library:
        lib = LIBRARIES[name]
        if args.device not in lib.devices:
            ap.error(f"--device {args.device}: {name} is surveyed on {list(lib.devices)}")
        survey(lib, args.device, args.python, args.installs, args.out)
    if args.interop:
        interop(args.interop, args.out)
    if args.out == RECORDS:
        PAGE.write_text(page(_records(RECORDS)))
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
