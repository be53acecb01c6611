"""Flux configurations (BFL ``src/flux/util.py``; Primus ``flux_{12b,535m}.yaml``).

``FluxConfig`` is frozen data; every derived size is a property. The named configs are the
public Flux 12B dev/schnell (identical except ``guidance_embed``), Primus' 535M CI model
(1 double + 1 single block at full width), and small configs for CPU tests whose widths
keep every replaced linear a multiple of 32 (MX blocks) and whose head size fits RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "CONFIGS",
    "FLUX_12B_DEV",
    "FLUX_12B_SCHNELL",
    "FLUX_535M",
    "FLUX_SMALL",
    "FLUX_TINY",
    "FluxConfig",
    "get_config",
]


@dataclass(frozen=True)
class FluxConfig:
    """Hyper-parameters of a Flux transformer; BFL field names."""

    name: str
    in_channels: int = 64
    out_channels: int = 64
    vec_in_dim: int = 768
    context_in_dim: int = 4096
    hidden_size: int = 3072
    mlp_ratio: float = 4.0
    num_heads: int = 24
    depth: int = 19
    depth_single_blocks: int = 38
    axes_dim: tuple[int, ...] = (16, 56, 56)
    theta: int = 10_000
    qkv_bias: bool = True
    guidance_embed: bool = False
    timestep_dim: int = 256  # sinusoidal embedding width fed to time_in / guidance_in

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"FluxConfig {self.name!r}: hidden_size={self.hidden_size} is not "
                             f"a multiple of num_heads={self.num_heads}")
        if sum(self.axes_dim) != self.head_dim:
            raise ValueError(f"FluxConfig {self.name!r}: axes_dim={self.axes_dim} sums to "
                             f"{sum(self.axes_dim)}, expected head_dim={self.head_dim}")
        if any(d % 2 for d in self.axes_dim):
            raise ValueError(f"FluxConfig {self.name!r}: every axes_dim entry must be even "
                             f"(RoPE rotates pairs), got {self.axes_dim}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    def with_(self, **changes: object) -> FluxConfig:
        """A copy with fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)  # type: ignore[arg-type]


FLUX_12B_DEV = FluxConfig("flux-12b-dev", guidance_embed=True)
FLUX_12B_SCHNELL = FluxConfig("flux-12b-schnell")
FLUX_535M = FluxConfig("flux-535m", depth=1, depth_single_blocks=1)
# CPU test models: two heads of 32 (RoPE axes 8+12+12), every linear dimension a multiple
# of 32 so MX recipes tile; FLUX_SMALL's dims are multiples of 256 so MXFP6 tiles too.
FLUX_TINY = FluxConfig("flux-tiny", in_channels=32, out_channels=32, vec_in_dim=32,
                       context_in_dim=64, hidden_size=64, num_heads=2, depth=1,
                       depth_single_blocks=1, axes_dim=(8, 12, 12), timestep_dim=64)
FLUX_SMALL = FluxConfig("flux-small", in_channels=64, out_channels=64, vec_in_dim=64,
                        context_in_dim=256, hidden_size=256, num_heads=4, depth=2,
                        depth_single_blocks=2, axes_dim=(16, 24, 24), timestep_dim=256)

CONFIGS: dict[str, FluxConfig] = {c.name: c for c in (
    FLUX_12B_DEV, FLUX_12B_SCHNELL, FLUX_535M, FLUX_SMALL, FLUX_TINY)}
CONFIGS["flux-12b"] = FLUX_12B_DEV  # what "Flux 12B" means on a command line


def get_config(name: str | FluxConfig) -> FluxConfig:
    """A config by name (``flux-12b``, ``flux-12b-dev``, ...) or the config itself."""
    if isinstance(name, FluxConfig):
        return name
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"model {name!r} is not a known Flux config; expected one of "
                         f"{sorted(CONFIGS)}") from None
