"""gateway package: the service around the harness (channels in, replies out, operators)."""

from gateway.errors import GatewayError

__all__ = ["GatewayError"]
