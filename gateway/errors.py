"""The root of every exception the gateway raises on purpose, and the exit status it ends with.

Tree::

    GatewayError                      root of everything gateway raises; `exit_status` (1)
    ├── StatusError(status)           the base of the errors below that carry their `status`
    ├── CliError(status)              a `gateway` command that cannot be done (2: the command line)
    ├── AskFailed(status)             `gateway ask` gave no answer
    ├── DemoError(status)             the crash demo cannot run (2: its --store; 1: a run failed)
    ├── PluginError (ValueError)      ``GATEWAY_PLUGIN`` cannot be imported or is malformed (2)
    ├── ModelConfigError (ValueError) ``GATEWAY_MODEL`` names no model this gateway can use (2)
    ├── StartRefused                  the store or the broker does not answer at start
    ├── BrokerError(code)             the broker could not be opened or used; `BrokerErrorCode`
    ├── PdfNotRead                    a PDF's text could not be read (broken, or past its limits)
    ├── TooLarge (ValueError)         an MCP server's line past the bound that names no request
    ├── ApiError(status, code)        an operator API refusal; `ApiErrorCode` (the envelope's)
    └── OpsError(status)              a `gateway ops` command that failed

Callers branch on the closed `code` of the errors that carry one, never on the message; a
command that ends with any of them prints its message as one line and exits `exit_status`.
Errors of the engine are `harness_core.HarnessError`, of the channels `adapters.AdapterError`.
"""

from __future__ import annotations

__all__ = ["GatewayError", "StatusError"]


class GatewayError(Exception):
    """Root of every exception the gateway raises on purpose; ``str()`` is one line for people."""

    @property
    def exit_status(self) -> int:
        """The status a command exits with when this error ends it (1: it failed)."""
        return 1


class StatusError(GatewayError):
    """A gateway error that carries the status its command exits with (`status`)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status

    @property
    def exit_status(self) -> int:
        """This error's own `status`."""
        return self.status
