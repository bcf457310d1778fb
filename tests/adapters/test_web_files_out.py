"""A tool's file reaches the web page: the reply names it, and its link serves the bytes.

Through the whole service (web channel, worker, outbox, deliverer) with a plugin tool that
returns a CSV: the reply item carries the file once, ``GET /web/files/{blob}`` serves it as a
download with its type, and a later run's reply carries nothing of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pytest

from gateway.broker.limits import blob_id
from gateway.channels import gateway_settings
from tests.support import report_agent
from tests.support.service_rig import ServiceRig, serving


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[ServiceRig]:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin="tests.support.report_agent",
    )
    async with serving(settings) as rig:
        yield rig


async def test_a_tools_csv_is_a_download_link_under_the_reply(rig: ServiceRig) -> None:
    await rig.post("t1", "export the tickets")
    [answer] = await rig.answers("t1", 1)
    assert answer["kind"] == "reply" and answer["text"] == report_agent.ANSWER
    blob = blob_id(report_agent.CSV)
    assert answer["files"] == [
        {
            "name": "tickets.csv",
            "media_type": "text/csv",
            "size": len(report_agent.CSV),
            "ref": None,
            "blob": blob,
            "refused": None,
        }
    ]
    link = f"/web/files/{quote(blob)}?space=default&name=tickets.csv&type=text%2Fcsv"
    served = await rig.http.get(link)
    assert served.status_code == 200
    assert served.content == report_agent.CSV
    assert served.headers["content-type"].startswith("text/csv")
    assert served.headers["content-disposition"].startswith('attachment; filename="tickets.csv"')
    assert served.headers["x-content-type-options"] == "nosniff"

    await rig.post("t1", "thanks")
    answers = await rig.answers("t1", 2)
    assert [a["text"] for a in answers] == [report_agent.ANSWER, "ok"]
    assert answers[1]["files"] == []
    replies = [a for a in answers if a["files"]]
    assert len(replies) == 1  # delivered once


async def test_a_file_link_serves_only_what_the_space_holds(rig: ServiceRig) -> None:
    unknown = blob_id(b"never held")
    missing = await rig.http.get(f"/web/files/{quote(unknown)}?space=default")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "no_such_file"
    not_a_blob = await rig.http.get("/web/files/..%2F..%2Fetc?space=default")
    assert not_a_blob.status_code == 404


async def test_a_page_link_never_renders_a_file_as_a_page(rig: ServiceRig) -> None:
    await rig.post("t2", "export")
    await rig.answers("t2", 1)
    blob = blob_id(report_agent.CSV)
    served = await rig.http.get(f"/web/files/{quote(blob)}?space=default&type=text/html&name=x")
    assert served.status_code == 200
    assert served.headers["content-disposition"].startswith("attachment")
    assert "sandbox" in served.headers["content-security-policy"]
    for odd in ("%D1%82/html", "%C3%A9/html"):  # a header holds Latin-1; a media type is ASCII
        served = await rig.http.get(f"/web/files/{quote(blob)}?space=default&type={odd}")
        assert served.status_code == 200
        assert served.headers["content-type"] == "application/octet-stream"
