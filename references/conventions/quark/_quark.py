"""Quark's fake-quantize module for a config spec, as the adapter builds it (eager: QUARK_DISABLE_COMPILE=1)."""

import os

os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
import torch
from quark.torch.quantization.config import config
from quark.torch.quantization.tensor_quantize import FakeQuantizeBase


def values(spec_name: str, x: torch.Tensor, **kwargs) -> torch.Tensor:
    spec = getattr(config, spec_name)(**kwargs).to_quantization_spec()
    with torch.no_grad():
        return FakeQuantizeBase.get_fake_quantize(spec)(x)
