"""What accelerator this process sees, and what each hardware marker needs.

``detect()`` reads torch only (never a vendor package). ``MXCHECK_FAKE_HARDWARE`` (for
example ``gfx950``, ``sm90:8`` or ``cpu``) replaces the reading, so the plugin's skips can
be tested on any machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

__all__ = [
    "FAKE_HARDWARE_ENV",
    "HARDWARE_MARKERS",
    "MARKERS",
    "Hardware",
    "Requirement",
    "detect",
    "detect_without_init",
    "missing",
    "pin_worker",
]

FAKE_HARDWARE_ENV = "MXCHECK_FAKE_HARDWARE"


@dataclass(frozen=True)
class Hardware:
    vendor: str  # "cpu" | "nvidia" | "amd"
    arch: str  # "cpu", "sm90", "gfx950", ...
    name: str
    device_count: int
    runtime: str | None = None
    faked: bool = False

    def describe(self) -> str:
        if self.vendor == "cpu":
            how = "faked by " + FAKE_HARDWARE_ENV if self.faked else f"torch {torch.__version__} sees no GPU"
            return f"cpu only ({how})"
        fake = f", faked by {FAKE_HARDWARE_ENV}" if self.faked else ""
        return f"{self.device_count} x {self.name} ({self.arch}{fake})"


@dataclass(frozen=True)
class Requirement:
    vendor: str
    arch: str | None
    needs: str  # how a skip reason says it


# The markers of DESIGN.md with the help text pytest shows; hardware ones name a requirement.
MARKERS: dict[str, str] = {
    "emulated": "runs on any CPU; no accelerator needed",
    "gfx950": "needs an AMD MI355X (gfx950) GPU",
    "gfx942": "needs an AMD MI300X (gfx942) GPU",
    "cuda": "needs an NVIDIA CUDA GPU",
    "sm90": "needs an NVIDIA Hopper (sm90) GPU",
    "sm100": "needs an NVIDIA Blackwell (sm100) GPU",
    "slow": "long-running; deselect with -m 'not slow'",
    "convergence": "short training runs that must reduce the loss",
}

HARDWARE_MARKERS: dict[str, Requirement] = {
    "cuda": Requirement("nvidia", None, "an NVIDIA CUDA GPU"),
    "sm90": Requirement("nvidia", "sm90", "an NVIDIA Hopper (sm90) GPU"),
    "sm100": Requirement("nvidia", "sm100", "an NVIDIA Blackwell (sm100) GPU"),
    "gfx950": Requirement("amd", "gfx950", "an AMD MI355X (gfx950) GPU"),
    "gfx942": Requirement("amd", "gfx942", "an AMD MI300X (gfx942) GPU"),
}

_FAKE = re.compile(r"^(cpu|sm\d+|gfx[0-9a-f]+)(?::(\d+))?$")


def _fake(spec: str) -> Hardware:
    m = _FAKE.match(spec.strip().lower())
    if not m:
        raise ValueError(f"{FAKE_HARDWARE_ENV}={spec!r}; expected cpu, smNN or gfxNNN, optionally "
                         "':<device count>' (e.g. gfx950:8)")
    arch, count = m.group(1), int(m.group(2) or (0 if m.group(1) == "cpu" else 1))
    if arch == "cpu":
        return Hardware("cpu", "cpu", "cpu", 0, None, faked=True)
    vendor = "nvidia" if arch.startswith("sm") else "amd"
    return Hardware(vendor, arch, f"fake {arch}", count, None, faked=True)


def detect() -> Hardware:
    """The accelerator torch sees (device 0), or the fake that the environment names."""
    spec = os.environ.get(FAKE_HARDWARE_ENV)
    if spec:
        return _fake(spec)
    if not torch.cuda.is_available():
        return Hardware("cpu", "cpu", "cpu", 0)
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        # gcnArchName carries target features ("gfx950:sramecc+:xnack-"); the arch is the head.
        arch = str(getattr(props, "gcnArchName", "gfx?")).split(":")[0]
        return Hardware("amd", arch, props.name, torch.cuda.device_count(), f"hip {torch.version.hip}")
    return Hardware("nvidia", f"sm{props.major}{props.minor}", props.name, torch.cuda.device_count(),
                    f"cuda {torch.version.cuda}")


def detect_without_init() -> Hardware:
    """Vendor and device count read without initialising CUDA or HIP (through NVML / AMD
    SMI), so that CUDA_VISIBLE_DEVICES set afterwards still takes effect. The arch is not
    read ("?"); use ``detect`` once devices are chosen."""
    spec = os.environ.get(FAKE_HARDWARE_ENV)
    if spec:
        return _fake(spec)
    probe = "_device_count_amdsmi" if torch.version.hip else "_device_count_nvml"
    try:
        count = int(getattr(torch.cuda, probe)())
    except Exception:  # no management library: no pinning rather than an early CUDA init
        count = -1
    if count <= 0:
        return Hardware("cpu", "cpu", "cpu", 0)
    return Hardware("amd" if torch.version.hip else "nvidia", "?", "?", count)


def missing(marker: str, hw: Hardware) -> str | None:
    """Why a test with this marker cannot run here, or None if it can."""
    req = HARDWARE_MARKERS.get(marker)
    if req is None or (hw.vendor == req.vendor and (req.arch is None or hw.arch == req.arch)):
        return None
    return f"{marker}: needs {req.needs}; this machine has {hw.describe()}"


def pin_worker(worker_id: str, hw: Hardware, environ: dict[str, str]) -> dict[str, str]:
    """Environment for an xdist worker ("gw3") on a multi-GPU runner: one GPU each.

    Empty when there is one device or fewer, or the runner already chose devices.
    """
    var = "HIP_VISIBLE_DEVICES" if hw.vendor == "amd" else "CUDA_VISIBLE_DEVICES"
    if hw.device_count <= 1 or var in environ or not worker_id.startswith("gw"):
        return {}
    return {var: str(int(worker_id[2:]) % hw.device_count)}
