"""adapters package: the channels (web, Slack, email) and the contract they keep."""

from adapters.errors import AdapterError

__all__ = ["AdapterError"]
