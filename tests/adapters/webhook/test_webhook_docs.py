"""docs/webhook.md's examples work as written: its curl request and its Python receiver.

The service runs on a real port (uvicorn) with the webhook channel pointed at the docs'
receiver, run as its own process; the docs' shell snippet (bash, curl, openssl) sends a
message, and the receiver prints the reply it verified.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

import httpx

from gateway.channels import gateway_settings
from gateway.service import Service
from tests.adapters.kit import serve
from tests.support.redis_server import free_port
from tests.support.webhook_peer import new_secret

DOC = Path(__file__).resolve().parents[3] / "docs" / "webhook.md"
SECRET = new_secret("docs")


def _block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    [found] = [b for b in blocks if containing in b]
    return str(found)


async def _listening(port: int, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return


async def test_the_docs_curl_request_is_answered_at_the_docs_receiver(tmp_path: Path) -> None:
    receiver_port = free_port()
    receiver = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _block("python", "HTTPServer"),
        env={**os.environ, "WEBHOOK_SECRET": SECRET, "PORT": str(receiver_port)},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await _listening(receiver_port)
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin="tests.support.gateway_agent",
            webhook_url=f"http://127.0.0.1:{receiver_port}/",
            webhook_secret=SECRET,
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        try:
            async with serve(service.app) as server:
                script = (
                    _block("sh", "curl -s -X POST")
                    .replace("SECRET=whsec_...", f"SECRET={SECRET}")
                    .replace("http://127.0.0.1:8787", server.url)
                )
                curl = await asyncio.create_subprocess_exec(
                    "bash", "-euo", "pipefail", "-c", script, stdout=asyncio.subprocess.PIPE
                )
                out, _ = await asyncio.wait_for(curl.communicate(), timeout=20)
                assert curl.returncode == 0
                answer = json.loads(out)
                assert answer["lane"] == "webhook:ticket-42" and answer["duplicate"] is False
                assert receiver.stdout is not None
                line = await asyncio.wait_for(receiver.stdout.readline(), timeout=20)
                assert line.decode().strip() == "reply ticket-42 You said: hello"
            async with httpx.AsyncClient() as client:
                forged = await client.post(
                    f"http://127.0.0.1:{receiver_port}/",
                    content=b'{"kind": "reply", "thread": "x", "text": "forged"}',
                    headers={
                        "webhook-id": "msg_x",
                        "webhook-timestamp": str(int(time.time())),
                        "webhook-signature": "v1,AAAA",
                    },
                )
            assert forged.status_code == 401  # the docs' receiver checks what it gets
        finally:
            await service.stop(drain_seconds=2)
    finally:
        receiver.kill()
        await receiver.wait()
