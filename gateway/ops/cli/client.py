"""The operator API over HTTP: requests, pages of items, and every failure as an `OpsError`."""

from __future__ import annotations

import re
from typing import Any

import httpx

from gateway.ops.cli.errors import UNREACHABLE, OpsError
from gateway.ops.cli.output import Json, clean
from gateway.ops.cli.target import API, TOKEN_VARIABLE, Target, on_this_machine

__all__ = ["PAGE", "Client"]

PAGE = 100
_ERRNO = re.compile(r"^\[Errno -?\d+\]\s*")


class Client:
    """The operator API over HTTP; every failure becomes an `OpsError`."""

    def __init__(self, target: Target, timeout: float) -> None:
        self.target = target
        self.url = target.url
        self.timeout = timeout
        headers = {"Accept": "application/json", "User-Agent": "gateway-ops"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.sent_token()}"
        self._http = httpx.Client(base_url=self.url + API, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """The JSON of a GET."""
        return self.request("GET", path, params=params)[1]

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        key: str | None = None,
    ) -> tuple[int, Any]:
        """The status and JSON of a successful answer (`key`: the Idempotency-Key)."""
        headers = {"Idempotency-Key": key} if key else None
        try:
            response = self._http.request(
                method,
                path,
                params={k: v for k, v in (params or {}).items() if v is not None},
                json=body,
                headers=headers,
            )
        except (httpx.ConnectTimeout, httpx.PoolTimeout):
            raise self._unreachable(f"no answer within {self.timeout:g} s") from None
        except httpx.TimeoutException:
            if key is None:
                raise self._unreachable(f"no answer within {self.timeout:g} s") from None
            # sent, and not answered: the action may have been taken ("is gateway serve
            # running?" invited a retry under a new key, which would act twice)
            raise OpsError(
                f"the gateway at {self.url} gave no answer within {self.timeout:g} s: the action "
                f"may have reached it; the same command with --idempotency-key {key} says what "
                "it did, and does nothing twice"
            ) from None
        except httpx.TransportError as exc:
            reason = _ERRNO.sub("", str(exc)).strip() or type(exc).__name__
            if key is not None and not isinstance(exc, httpx.ConnectError):
                # sent, then the connection went (the gateway died mid-action): the action may
                # have been taken, and "cannot reach" invited a retry under a new key that
                # would act twice (an outside probe)
                raise OpsError(
                    f"the gateway at {self.url} dropped the connection before it answered "
                    f"({clean(reason)}): the action may have reached it; once it is back, the "
                    f"same command with --idempotency-key {key} says what it did, and does "
                    "nothing twice",
                    UNREACHABLE,
                ) from None
            raise self._unreachable(reason) from None
        except httpx.InvalidURL as exc:  # a name of 100,000 characters: "unexpected InvalidURL"
            said = clean(str(exc))
            raise OpsError(f"cannot ask for that: {said} (is a name too long?)") from None
        return self._judge(response)

    def pages(
        self, path: str, params: dict[str, Any], *, limit: int | None = None, size: int = PAGE
    ) -> Json:
        """Every page's items (up to `limit`), as one page: the first page's other fields kept."""
        merged: Json = {}
        items: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            want = size if limit is None else min(size, limit - len(items))
            page = self.get(path, {**params, "limit": want, "cursor": cursor})
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise OpsError(f"unexpected answer from {self.url}: not a page of items")
            merged = merged or dict(page)
            items.extend(page["items"])
            cursor = page.get("next_cursor") or None
            if cursor is None or cursor in seen or (limit is not None and len(items) >= limit):
                break
            seen.add(cursor)
        merged.update(items=items, next_cursor=cursor)
        return merged

    def _unreachable(self, reason: str) -> OpsError:
        return OpsError(
            f"cannot reach the gateway at {self.url} ({clean(reason)}): is gateway serve running? "
            "(another address: --url or GATEWAY_OPS_URL)",
            UNREACHABLE,
        )

    def _judge(self, response: httpx.Response) -> tuple[int, Any]:
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            if body is None:
                raise OpsError(
                    f"unexpected answer from {self.url}: HTTP {status} without JSON "
                    "(is that the gateway's address?)"
                )
            return status, body
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            raise OpsError(
                f"unexpected answer from {self.url}: HTTP {status} (is that the gateway's address?)"
            )
        code = str(error.get("code") or status)
        message = str(error.get("message") or "refused")
        details = error.get("details")
        details = details if isinstance(details, dict) else {}
        if status == 401:
            raise OpsError(self._unauthenticated(message))
        extra = _detail(details)
        line = f"{message} ({code}{', ' + extra if extra else ''})"
        if status == 403 and "operator" not in message:
            line += ": this needs an operator token"
        raise OpsError(clean(line), code=code)

    def _unauthenticated(self, message: str) -> str:
        target = self.target
        how = f"pass an operator or viewer token with --token TOKEN or {TOKEN_VARIABLE}"
        path = target.token_file()
        if target.token is None:
            local = f" (a local gateway without ops_tokens keeps one in {path})" if path else ""
            if path is not None and path.exists() and not on_this_machine(target.url):
                local = f" ({path} is the local gateway's, and is sent to no other address)"
            elif target.token_file_problem is not None:
                local = f" ({target.token_file_problem}: run as the gateway's user)"
            return f"no token was given (unauthenticated): {how}{local}"
        if target.token_source.startswith("the token file"):
            how += (
                " (that file belongs to another gateway, or an older start of this one; a "
                "gateway serving another store keeps its own: give its --store or --config; "
                "behind a proxy on another port, pass the token itself)"
            )
        elif path is not None:
            how += f", or leave both unset to use the local gateway's token in {path}"
        return clean(
            f"the token from {target.token_source} was refused: {message} (unauthenticated): {how}"
        )


def _detail(details: dict[str, Any]) -> str:
    reason = details.get("reason")
    if reason:
        return str(reason)
    fields = details.get("fields")
    if isinstance(fields, list) and fields:
        return "; ".join(
            f"{item.get('field')}: {item.get('reason')}"
            for item in fields[:3]
            if isinstance(item, dict)
        )
    return ""
