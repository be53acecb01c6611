"""``mxcheck info`` and ``mxcheck formats``: what this install is and the format constants,
each collected as JSON-able data and rendered as text beside it."""

from __future__ import annotations

import argparse
import importlib
import math
import platform
from fractions import Fraction
from typing import Any

import torch

import mxcheck
from mxcheck import hardware
from mxcheck.cli.common import CommandError, add_json_flag, out, to_json
from mxcheck.formats import FORMATS, FloatFormat
from mxcheck.report.environment import package_versions
from mxcheck.text import table

__all__ = ["collect_info", "exact_text", "format_row", "formats_text", "info_text"]


# ---- info ---------------------------------------------------------------------------


def _backends() -> tuple[dict[str, tuple[bool, str]] | None, str]:
    """(name -> (usable, why not), "") or (None, why the registry could not be read)."""
    try:
        # Late: a backend's factory may import its vendor package.
        registry = importlib.import_module("mxcheck.backends")
        return dict(registry.available_backends()), ""
    except (ImportError, AttributeError):
        return None, "registry not available"
    except Exception as e:  # a broken registry must not cost the rest of the report
        return None, f"registry failed: {type(e).__name__}: {e}"


def collect_info() -> dict[str, Any]:
    """What ``mxcheck info`` shows, as JSON-able data."""
    try:
        hw = hardware.detect()
    except ValueError as e:  # a malformed MXCHECK_FAKE_HARDWARE
        raise CommandError(str(e)) from None
    backends, why = _backends()
    markers = {}
    for name, help_text in hardware.MARKERS.items():
        reason = hardware.missing(name, hw)
        markers[name] = {"runs": reason is None, "reason": reason, "help": help_text}
    return {
        "mxcheck": mxcheck.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "hardware": {"vendor": hw.vendor, "arch": hw.arch, "name": hw.name,
                     "device_count": hw.device_count, "runtime": hw.runtime,
                     "faked": hw.faked, "description": hw.describe()},
        "packages": package_versions(),
        "backends": None if backends is None else {
            name: {"usable": ok, "reason": reason} for name, (ok, reason) in backends.items()},
        "backends_error": why or None,
        "markers": markers,
    }


def info_text(info: dict[str, Any]) -> str:
    """``collect_info()`` as the text ``mxcheck info`` prints."""
    hw = info["hardware"]
    text = [f"mxcheck {info['mxcheck']} (torch {info['torch']}, python {info['python']})\n",
            "\nhardware:\n",
            table([("device", hw["description"]), ("vendor", hw["vendor"]),
                   ("arch", hw["arch"]), ("name", hw["name"]),
                   ("devices", str(hw["device_count"])), ("runtime", hw["runtime"] or "-"),
                   ("faked", f"yes ({hardware.FAKE_HARDWARE_ENV})" if hw["faked"] else "no")]),
            "\npackages:\n",
            table([(k, v or "not installed") for k, v in info["packages"].items()])]
    if info["backends"] is None:
        text.append(f"\nbackends: {info['backends_error']}\n")
    else:
        text.append("\nbackends:\n")
        text.append(table([(name, "usable" if b["usable"] else f"not usable: {b['reason']}")
                           for name, b in info["backends"].items()]) or "  (none registered)\n")
    text.append("\nmarkers here:\n")
    here = f"this machine has {hw['description']}"
    text.append(table([(name, "runs" if m["runs"] else "skips",
                        m["reason"] if not m["runs"] else
                        f"{m['help']}; {here}" if name in hardware.HARDWARE_MARKERS else m["help"])
                       for name, m in info["markers"].items()]))
    return "".join(text)


def info_args(p: argparse.ArgumentParser) -> None:
    add_json_flag(p)


def run_info(args: argparse.Namespace) -> int:
    info = collect_info()
    out(to_json(info) if args.json else info_text(info))
    return 0


# ---- formats ------------------------------------------------------------------------


def exact_text(v: float) -> str:
    """A format constant, exactly: ``448``, ``7.5``, ``2^-9 = 0.001953125``, ``2^127 ≈ 1.701e+38``.

    Small integers and short exact decimals print as they are; other powers of two and
    large values add the form n * 2^k (n odd), which is exact, and then the decimal,
    with ``=`` where it is the exact value and ``≈`` (4 digits) where it is not.
    """
    if not math.isfinite(v) or v == 0:
        return repr(v)
    num, den = Fraction(v).as_integer_ratio()
    k = -(den.bit_length() - 1)  # den is a power of two
    while num % 2 == 0:
        num //= 2
        k += 1
    if den == 1 and v < 2**24:
        return str(int(v))
    short = repr(v)
    exact_short = Fraction(short) == Fraction(v) and len(short) <= 17
    if exact_short and num != 1:
        return short
    power = f"2^{k}" if num == 1 else f"{num} * 2^{k}"
    return f"{power} = {short}" if exact_short else f"{power} ≈ {v:.4g}"


def _code(code: int | None, fmt: FloatFormat) -> str:
    return "none" if code is None else f"0x{code:0{(fmt.bits + 3) // 4}x}"


def format_row(fmt: FloatFormat) -> dict[str, Any]:
    """One format's constants as JSON-able data (min_subnormal is None without subnormals)."""
    return {"name": fmt.name, "bits": fmt.bits, "ebits": fmt.ebits, "mbits": fmt.mbits,
            "bias": fmt.bias, "emax": fmt.emax, "emin": fmt.emin, "max": fmt.max,
            "min_normal": fmt.min_normal,
            "min_subnormal": fmt.min_subnormal if fmt.subnormals else None,
            "nan_code": fmt.nan_code, "inf_code": fmt.inf_code, "nan": fmt.nan,
            "inf": fmt.inf, "signed": fmt.signed, "max_code": fmt.max_code}


def formats_text() -> str:
    """Every format's constants as the table ``mxcheck formats`` prints."""
    rows = [("name", "bits", "ebits", "mbits", "bias", "emax", "emin", "max", "min normal",
             "min subnormal", "NaN code", "Inf code")]
    for f in FORMATS.values():
        rows.append((f.name, str(f.bits), str(f.ebits), str(f.mbits), str(f.bias), str(f.emax),
                     str(f.emin), exact_text(f.max), exact_text(f.min_normal),
                     exact_text(f.min_subnormal) if f.subnormals else "none",
                     _code(f.nan_code, f) + ("" if f.nan == "none" else f" ({f.nan})"),
                     _code(f.inf_code, f)))
    return table(rows, indent="")


def formats_args(p: argparse.ArgumentParser) -> None:
    add_json_flag(p)


def run_formats(args: argparse.Namespace) -> int:
    if args.json:
        out(to_json({name: format_row(f) for name, f in FORMATS.items()}))
    else:
        out(formats_text())
    return 0
