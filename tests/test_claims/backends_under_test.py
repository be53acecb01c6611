"""Backends that each declare (or fail to declare) one thing, for tests/test_claims.py."""

from mxcheck.backends import MissingDependency, Refusal
from mxcheck.backends.emulated import EmulatedBackend


class RaisesValueError(EmulatedBackend):
    """Its own argument check fires inside quantize on a recipe it accepted: a bug, not a refusal."""

    name = "raises-value-error"

    def quantize(self, x, spec, *, state=None):
        raise ValueError("my_quant: unexpected layout")


class Refuses(EmulatedBackend):
    """Declares that it cannot take the input, with the reason."""

    name = "refuses"

    def quantize(self, x, spec, *, state=None):
        raise Refusal(f"my_quant takes K multiples of 1024, got K={x.shape[-1]}")


class DisownsItsClaim(EmulatedBackend):
    name = "disowns-its-claim"
    claims = ("ocp-mxfp8-e4m3",)

    def supports(self, recipe):
        return False, "no MX kernels in this build"


class SupportsNothing(EmulatedBackend):
    name = "supports-nothing"

    def supports(self, recipe):
        return False, "no kernels in this build"


class TooOld(EmulatedBackend):
    name = "too-old"

    def available(self):
        return False, MissingDependency("mykernels", ">=2.0", "1.3")


class ClaimsOcp(EmulatedBackend):
    name = "claims-ocp"
    claims = ("ocp-mxfp4", "ocp-mxfp8-e5m2")
