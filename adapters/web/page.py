"""The web channel's pages: a thread (a form and a live Server-Sent Events view) and a list.

Plain HTML, one inline style and one inline script each, no build step and no external assets.
Every text from a message or a reply is shown with ``textContent`` (Markdown as written, never
interpreted as HTML), and a Content-Security-Policy allows only these exact inline script and
style blocks (by hash) and requests to this origin, so even a bug that put reply text into the
markup could not run a script.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from urllib.parse import quote

from adapters.web.mailbox import NAME_RULE
from harness_core.session.records import MAX_SUPPLIED_CHARS

__all__ = ["content_security_policy", "index_page", "login_page", "thread_page"]

_STYLE = """
:root { color-scheme: light dark; --line: #8884; --soft: #8881; --accent: #3b6fd8; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 52rem; padding: 1rem; }
header { display: flex; gap: 1rem; align-items: baseline; flex-wrap: wrap; }
h1 { font-size: 1.15rem; margin: 0; word-break: break-all; }
.status { font-size: .85rem; opacity: .7; }
.signed-in { margin-left: auto; font-size: .85rem; }
.items { display: flex; flex-direction: column; gap: .6rem; margin: 1rem 0; }
.item { border: 1px solid var(--line); border-radius: .5rem; padding: .5rem .75rem; }
.item.message { background: var(--soft); margin-left: 3rem; }
.item.reply { margin-right: 3rem; }
.files a, .files span { display: block; margin-top: .3rem; }
.item.live { border-style: dashed; }
.item.failure_notice { border-color: #d33; margin-right: 3rem; }
.item.approval_request { border-color: #d90; margin-right: 3rem; }
.item.decision { font-size: .85rem; opacity: .8; border-style: dashed; }
.meta { font-size: .8rem; opacity: .7; margin-bottom: .25rem; }
.text { white-space: pre-wrap; overflow-wrap: anywhere; }
.label { font-weight: 600; margin-right: .4rem; }
.call { border-top: 1px solid var(--line); margin-top: .5rem; padding-top: .5rem; }
.call pre { margin: .25rem 0; white-space: pre-wrap; overflow-wrap: anywhere; font-size: .85rem; }
.controls { display: flex; gap: .5rem; flex-wrap: wrap; align-items: center; margin-top: .5rem; }
.decided { font-size: .85rem; margin-top: .4rem; font-weight: 600; }
.supply { display: grid; gap: .4rem; margin-top: .5rem; }
.supply[hidden] { display: none; }
.supply textarea { min-height: 4rem; font: inherit; padding: .4rem; }
form.compose { display: grid; gap: .5rem; grid-template-columns: 1fr auto; }
form.compose textarea { grid-column: 1 / -1; min-height: 5rem; font: inherit; padding: .5rem; }
button, input { font: inherit; padding: .3rem .8rem; }
button { cursor: pointer; }
.working { font-size: .85rem; opacity: .7; min-height: 1.2em; }
.error { color: #d33; grid-column: 1 / -1; min-height: 1.2em; }
ul.threads { padding-left: 1.2rem; }
""".strip()

_THREAD_SCRIPT = """
(() => {
  "use strict";
  const cfg = JSON.parse(document.getElementById("config").textContent);
  const space = "space=" + encodeURIComponent(cfg.space);
  const list = document.getElementById("items");
  const status = document.getElementById("status");
  const form = document.getElementById("compose");
  const textBox = document.getElementById("text");
  const authorBox = document.getElementById("author");
  const error = document.getElementById("error");
  const working = document.getElementById("working");
  const sendButton = form.querySelector("button[type=submit]");
  const seen = new Set();
  let newest = 0;  // the newest item shown: a stream opened again starts after it
  const waits = new Map();
  const decided = new Map();
  const closedWaits = new Map();
  let pending = null;
  // what the agent writes while it works (live only: the durable reply replaces it)
  const liveBox = el("div", "item reply live");
  liveBox.id = "live";
  liveBox.appendChild(el("div", "meta", "assistant \u00b7 writing..."));
  const liveText = el("div", "text");
  liveBox.appendChild(liveText);
  let liveKey = null;
  let liveShown = "";
  // signed in (the box hidden): messages are by the token's name, none is sent
  authorBox.value = authorBox.hidden ? "" : (localStorage.getItem("web-author") || "");

  // Format characters (bidi overrides and isolates, zero-width ones) shown as \\uXXXX where
  // a value is judged (an approval's arguments, a file's name): "api\u202e" must not read
  // as another value than the one that runs. Joiners stay: emoji and scripts need them.
  const FORMAT = new RegExp("[\\u00ad\\u061c\\u180e\\u200b\\u200e\\u200f\\u202a-\\u202e" +
    "\\u2060-\\u2064\\u2066-\\u206f\\ufeff\\ufff9-\\ufffb]", "g");
  function visible(text) {
    const shown = (c) => "\\\\u" + c.charCodeAt(0).toString(16).padStart(4, "0");
    return String(text).replace(FORMAT, shown);
  }
  function fileText(file) {
    return visible(file.name) + " (" + visible(file.media_type || "") + ", " +
      file.size.toLocaleString("en") + (file.size === 1 ? " byte)" : " bytes)");
  }
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function newId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return Date.now().toString(36) + "-" + Math.random().toString(36).slice(2);
  }
  function when(ms) { return new Date(ms).toLocaleString(); }
  function who(author) { return author ? (author.name || author.id) : "someone"; }
  let refusal = "";
  async function send(path, body) {
    // null when sent; else what to say (and `refusal`: the error code, if the gateway gave one)
    refusal = "";
    let response;
    try {
      response = await fetch(path, {
        method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify(body),
      });
    } catch (e) {
      return "network error: not sent; send again (nothing is posted twice)";
    }
    if (response.ok) return null;
    let message = "HTTP " + response.status;
    try {
      const error = (await response.json()).error;
      message = error.message;
      refusal = error.code;
    } catch (e) { /* keep it */ }
    return message;
  }
  function close(box, said) {
    // a card says one thing: the gateway's close replaces what the page guessed before it
    box.dataset.decided = "1";
    box.querySelectorAll("button, input, textarea").forEach((b) => { b.disabled = true; });
    let note = box.querySelector(".decided");
    if (!note) { note = el("div", "decided"); box.appendChild(note); }
    note.textContent = said;
  }
  function closeWait(waitId) {
    // the gateway says how a request closed (decided anywhere, stopped, aborted): every card
    const said = closedWaits.get(waitId);
    if (said === undefined) return false;
    for (const box of waits.get(waitId) || []) close(box, said);
    return true;
  }
  function firstLine(text) {
    // a supplied result as the gateway shows it: its first non-blank line, shortened
    const lines = String(text).split(/\\r?\\n/)
      .map((l) => l.split(/\\s+/).filter(Boolean).join(" ")).filter(Boolean);
    const first = lines[0] || "";
    if (first.length > 200) return first.slice(0, 199) + "\u2026";
    return first + (lines.length > 1 ? "\u2026" : "");
  }
  function decisionWords(item) {
    // "Ann: approve", or "Ann supplied the result: <first line>" (the tool did not run)
    const ds = item.decision.decisions;
    if (ds.every((d) => d.supplied)) {
      const failed = ds[0].supplied.is_error ? " (the action failed)" : "";
      return who(item.author) + " supplied the result" + failed + ": " +
        firstLine(ds[0].supplied.text);
    }
    const verbs = ds.map((d) => d.supplied ? "supply" : d.approved ? "approve" : "deny");
    return who(item.author) + ": " + verbs.join(", ");
  }
  function markDecided(waitId) {
    // a request and its reminders share the wait: one decision closes every copy
    const item = decided.get(waitId);
    if (!item) return;
    const verdicts = item.decision.decisions.map(
      (d) => d.supplied ? "result supplied" : d.approved ? "approved" : "denied");
    const all = verdicts.every((v) => v === verdicts[0]) ? verdicts[0] : verdicts.join(", ");
    for (const box of waits.get(waitId) || []) {
      if (!box.dataset.decided) close(box, "Decision sent by " + who(item.author) + ": " + all);
    }
  }
  function closeWaiting() {
    // a reply means the run that waited has ended (answered or stopped): nothing waits now
    for (const boxes of waits.values()) {
      for (const box of boxes) if (!box.dataset.decided) close(box, "No longer waiting.");
    }
  }
  function approvalControls(box, item) {
    const view = item.approval;
    const choices = new Map();
    for (const call of view.calls) {
      const row = el("div", "call");
      row.appendChild(el("span", "label", visible(call.tool_name)));
      row.appendChild(el("pre", "", visible(JSON.stringify(call.args, null, 2))));
      if (view.calls.length > 1) {
        const pick = el("div", "controls");
        for (const verdict of ["approve", "deny"]) {
          const label = el("label");
          const radio = el("input");
          radio.type = "radio";
          radio.name = item.seq + ":" + call.tool_call_id;
          radio.addEventListener("change", () => choices.set(call.tool_call_id, verdict));
          label.appendChild(radio);
          label.appendChild(document.createTextNode(" " + verdict));
          pick.appendChild(label);
        }
        row.appendChild(pick);
      }
      box.appendChild(row);
    }
    const controls = el("div", "controls");
    const reason = el("input");
    reason.placeholder = "reason (optional)";
    const note = el("span", "error");
    async function decide(verdictOf, supplied) {
      const decisions = view.calls.map((call) => ({
        tool_call_id: call.tool_call_id,
        args_digest: call.args_digest,
        approved: supplied ? true : verdictOf(call) === "approve",
        reason: reason.value || null,
        ...(supplied || {}),
      }));
      box.querySelectorAll("button").forEach((b) => { b.disabled = true; });
      const failed = await send("decisions", {
        space: cfg.space, run_id: view.run_id, wait_id: view.wait_id, decisions,
        author: authorBox.value || null,
      });
      if (failed && refusal === "no_longer_waiting") {
        closedWaits.set(view.wait_id, failed);  // it closed before the click: say how, here
        closeWait(view.wait_id);
        return;
      }
      note.textContent = failed || "";
      if (failed) box.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    }
    const many = view.calls.length > 1;
    const approve = el("button", "", many ? "Approve all" : "Approve");
    approve.type = "button";
    approve.addEventListener("click", () => decide(() => "approve"));
    const deny = el("button", "", many ? "Deny all" : "Deny");
    deny.type = "button";
    deny.addEventListener("click", () => decide(() => "deny"));
    controls.append(approve, deny);
    if (many) {
      const chosen = el("button", "", "Send choices");
      chosen.type = "button";
      chosen.addEventListener("click", () => {
        if (view.calls.some((c) => !choices.has(c.tool_call_id))) {
          note.textContent = "choose approve or deny for every call";
          return;
        }
        decide((call) => choices.get(call.tool_call_id));
      });
      controls.appendChild(chosen);
    }
    // "Done it myself": the person did the action and gives its result; the tool does not run
    const mine = el("button", "", "Done it myself");
    mine.type = "button";
    const form = el("div", "supply");
    form.hidden = true;
    const result = el("textarea");
    result.placeholder = "What happened? The agent reads this as the result" +
      (many ? " of every call" : "");
    result.setAttribute("aria-label", "result");
    const failedBox = el("input");
    failedBox.type = "checkbox";
    const failed = el("label");
    failed.append(failedBox, document.createTextNode(" it failed"));
    const sendResult = el("button", "", "Submit result");
    sendResult.type = "button";
    mine.addEventListener("click", () => { form.hidden = false; result.focus(); });
    sendResult.addEventListener("click", () => {
      const size = [...result.value].length;
      if (!result.value.trim()) { note.textContent = "write what happened first"; return; }
      if (size > cfg.max_supplied_chars) {
        note.textContent = "The result has " + size.toLocaleString("en") + " characters; " +
          "at most " + cfg.max_supplied_chars.toLocaleString("en") + " are accepted: " +
          "nothing was sent.";
        return;
      }
      decide(null, {result: result.value, is_error: failedBox.checked});
    });
    form.append(result, failed, sendResult);
    controls.append(mine, reason, note);
    box.appendChild(controls);
    box.appendChild(form);
    waits.set(view.wait_id, [...(waits.get(view.wait_id) || []), box]);
  }
  function endLive() {
    liveKey = null;
    liveShown = "";
    liveText.textContent = "";
    liveBox.remove();
  }
  function showLive(update) {
    if (update.run_id === null) return;  // its answer was delivered: the reply replaces it
    const key = update.run_id + ":" + update.step;
    if (key !== liveKey) { liveKey = key; liveShown = ""; }
    if (update.offset > liveShown.length) return;  // never shown the start: wait for the reply
    liveShown = liveShown.slice(0, update.offset) + update.text;
    if (update.status) working.textContent = "the agent " + update.status;
    liveText.textContent = liveShown;
    if (!liveShown) { liveBox.remove(); return; }
    if (!liveBox.isConnected) list.appendChild(liveBox);
    scrollToEnd();
  }
  // once a frame, not once an item: each scroll lays the whole list out, and a thread of
  // 12,000 items replayed by its stream held the page 39 s at a time (an outside probe)
  let scrollPending = false;
  function scrollToEnd() {
    if (scrollPending) return;
    scrollPending = true;
    requestAnimationFrame(() => {
      scrollPending = false;
      const last = list.lastElementChild;
      if (last) last.scrollIntoView({block: "end"});
    });
  }
  function fileLinks(files) {
    // a reply's files: download links (the name and type travel in the link; see get_file);
    // a message's files: their names (the thread keeps no copy of what a person sent)
    const box = el("div", "files");
    for (const file of files) {
      if (!file.blob) {
        box.appendChild(el("span", "file", fileText(file)));
        continue;
      }
      const link = el("a", "file", fileText(file));
      link.href = "../../files/" + encodeURIComponent(file.blob) + "?" + space +
        "&name=" + encodeURIComponent(file.name) + "&type=" + encodeURIComponent(file.media_type);
      link.download = file.name;
      box.appendChild(link);
    }
    return box;
  }
  function render(item) {
    if (seen.has(item.seq)) return;
    seen.add(item.seq);
    newest = Math.max(newest, item.seq);
    const box = el("div", "item " + item.kind);
    const labels = {
      message: who(item.author), reply: "assistant", approval_request: "approval needed",
      failure_notice: "failed", decision: "decision", approval_closed: "approval closed",
    };
    box.appendChild(el("div", "meta", labels[item.kind] + " \\u00b7 " + when(item.at_ms)));
    if (item.kind === "decision") {
      box.appendChild(el("div", "text", decisionWords(item)));
      decided.set(item.decision.wait_id, item);
      list.appendChild(box);
      markDecided(item.decision.wait_id);
      working.textContent = "the agent is working on it...";
      return;
    }
    if (item.kind === "approval_closed") {
      const waitId = item.closed ? item.closed.wait_id : "";
      closedWaits.set(waitId, item.text);
      closeWait(waitId);
      if ((waits.get(waitId) || []).length) return;  // its cards say it
      box.appendChild(el("div", "text", item.text));  // no card of it here: say it once
      list.appendChild(box);
      return;
    }
    // a message or a decision sets the agent to work; whatever it sends ends that
    working.textContent = item.kind === "message" ? "the agent is working on it..." : "";
    if (item.kind !== "message") endLive();
    box.appendChild(el("div", "text", item.text));
    if (item.kind === "reply") closeWaiting();
    if (item.files && item.files.length) box.appendChild(fileLinks(item.files));
    if (item.kind === "approval_request" && item.approval) approvalControls(box, item);
    list.appendChild(box);
    if (item.approval && !closeWait(item.approval.wait_id)) markDecided(item.approval.wait_id);
    scrollToEnd();
  }

  // A stream the browser retries itself (a dropped connection) comes back on its own; one
  // answered with an error (a 503 while the gateway is busy or restarting, a proxy's 502) is
  // closed for good by the browser: it is opened again here, after a growing pause, from the
  // newest item shown.
  let retryMs = 1000;
  function listen() {
    const events = new EventSource("events?" + space + "&after=" + newest + "&live=1");
    // a new stream (maybe a restarted gateway) says afresh what runs are writing now
    events.onopen = () => { status.textContent = "live"; retryMs = 1000; endLive(); };
    events.onerror = async () => {
      status.textContent = "reconnecting...";
      if (events.readyState !== EventSource.CLOSED) return;
      // refused: a sign-in that ended (the channel's tokens) is said, not retried for ever
      try {
        const thread = "../" + encodeURIComponent(cfg.thread);
        const probe = await fetch(thread + "?" + space + "&limit=1");
        if (probe.status === 401) {
          status.textContent = "signed out: reload the page to sign in again";
          return;
        }
      } catch (e) { /* the gateway is away: retried below */ }
      setTimeout(listen, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
    events.onmessage = (event) => render(JSON.parse(event.data));
    events.addEventListener("live", (event) => showLive(JSON.parse(event.data)));
  }
  listen();

  function tooLong(text) {
    // counted as the server counts (code points), and said, never cut: nothing is lost
    const size = [...text].length;
    if (size <= cfg.max_text_chars) return null;
    return "This message has " + size.toLocaleString("en") + " characters; at most " +
      cfg.max_text_chars.toLocaleString("en") + " are accepted. Shorten it or send it in " +
      "parts: nothing was sent.";
  }
  textBox.addEventListener("input", () => {
    const said = tooLong(textBox.value);
    if (said) { error.textContent = said; error.dataset.size = "1"; }
    else if (error.dataset.size) { error.textContent = ""; delete error.dataset.size; }
  });

  const fileBox = document.getElementById("files");
  function base64Of(file) {
    // the file's bytes as base64 (a data: URL's payload), read in the browser
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).split(",", 2)[1] || "");
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = textBox.value;
    const chosen = Array.from(fileBox.files || []);
    if (!text.trim() && !chosen.length) { error.textContent = "write something first"; return; }
    const over = tooLong(text);
    if (over) { error.textContent = over; return; }
    // files go as base64 (4 characters for each 3 bytes): said in the person's terms before a
    // byte is read, not as the request's 413 in bytes after encoding 40 MB (an outside probe)
    const bytes = chosen.reduce((sum, f) => sum + f.size, 0);
    if (cfg.max_upload_bytes && bytes * 4 / 3 + text.length > cfg.max_upload_bytes) {
      const mb = (n) => (n / 1e6).toLocaleString("en", {maximumFractionDigits: 1}) + " MB";
      error.textContent = "These files are " + mb(bytes) + " together; at most about " +
        mb(cfg.max_upload_bytes * 3 / 4) + " can be sent at once: nothing was sent.";
      return;
    }
    const names = chosen.map((f) => f.name + ":" + f.size + ":" + f.lastModified).join("/");
    if (!pending || pending.text !== text || pending.names !== names) {
      pending = {id: newId(), text, names};
    }
    if (!authorBox.hidden) localStorage.setItem("web-author", authorBox.value);
    sendButton.disabled = true;
    sendButton.textContent = "Sending...";
    const body = {
      text, client_message_id: pending.id, author: authorBox.value || null, space: cfg.space,
    };
    let failed = null;
    try {
      if (chosen.length) {
        body.files = await Promise.all(chosen.map(async (f) => ({
          name: f.name, media_type: f.type || "application/octet-stream", data: await base64Of(f),
        })));
      }
    } catch (e) {
      failed = "a file could not be read here: nothing was sent";
    }
    if (!failed) {
      failed = await send(chosen.length ?
        "../../uploads/" + encodeURIComponent(cfg.thread) : "messages", body);
    }
    sendButton.disabled = false;
    sendButton.textContent = "Send";
    error.textContent = failed || "";
    if (!failed) { pending = null; textBox.value = ""; fileBox.value = ""; }
  });
  textBox.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
})();
""".strip()


def _digest(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def content_security_policy(*, script: bool) -> str:
    """The page's policy: only its own inline style (and script) and requests to this origin."""
    scripts = _digest(_THREAD_SCRIPT) if script else "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src {_digest(_STYLE)}; "
        "connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'"
    )


def _json_for_html(value: object) -> str:
    """JSON safe inside a ``<script type="application/json">`` block."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _signed_in(user: str | None, logout: str) -> str:
    """Who is signed in and a sign-out button (nothing when the channel has no login)."""
    if user is None:
        return ""
    return (
        f'<form class="signed-in" method="post" action="{logout}">signed in as '
        f'<b>{html.escape(user)}</b> <button type="submit">Sign out</button></form>'
    )


def thread_page(
    *,
    space: str,
    thread: str,
    max_text_chars: int,
    user: str | None = None,
    max_upload_bytes: int = 0,
) -> str:
    """The page of one thread (everything it shows arrives through its event stream).

    `max_upload_bytes`: the bound of an upload's request (0: not checked on the page).
    """
    title = html.escape(f"{thread}" if space == "default" else f"{space} / {thread}")
    config = _json_for_html(
        {
            "space": space,
            "thread": thread,
            "max_text_chars": max_text_chars,
            "max_supplied_chars": MAX_SUPPLIED_CHARS,
            "max_upload_bytes": max_upload_bytes,
        }
    )
    back = html.escape(f"../../?space={space}", quote=True)
    json_link = html.escape(f"../{thread}?space={space}", quote=True)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - web thread</title>
<style>{_STYLE}</style>
</head>
<body>
<header><a href="{back}">threads</a><h1>{title}</h1>
<span class="status" id="status">connecting...</span>{_signed_in(user, "../../logout")}</header>
<noscript>This page needs JavaScript; the thread is also at
<a href="{json_link}">its JSON</a>.</noscript>
<main class="items" id="items" aria-live="polite"></main>
<div class="working" id="working" role="status"></div>
<form class="compose" id="compose">
<textarea id="text" name="text"
 placeholder="Message (Ctrl+Enter sends)" aria-label="message"></textarea>
<input id="author" name="author" maxlength="100" placeholder="your name (optional)"
 aria-label="your name"{" hidden" if user is not None else ""}>
<input id="files" name="files" type="file" multiple aria-label="attach files">
<button type="submit">Send</button>
<div class="error" id="error" role="alert"></div>
</form>
<script type="application/json" id="config">{config}</script>
<script>{_THREAD_SCRIPT}</script>
</body>
</html>
"""


def index_page(
    *, space: str, threads: list[tuple[str, int]], suggestion: str, user: str | None = None
) -> str:
    """The list of a space's threads (newest first) and a form to open one."""
    rows = "\n".join(
        f'<li><a href="threads/{html.escape(quote(t, safe=""), quote=True)}/page?space='
        f'{html.escape(quote(space, safe=""), quote=True)}">{html.escape(t)}</a></li>'
        for t, _ in threads
    )
    body = f'<ul class="threads">\n{rows}\n</ul>' if rows else "<p>No threads yet.</p>"
    esc_space = html.escape(space, quote=True)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>web threads - {esc_space}</title>
<style>{_STYLE}</style>
</head>
<body>
<header><h1>Web threads</h1><span class="status">space {esc_space}</span>\
{_signed_in(user, "logout")}</header>
<form class="compose" method="get" action="open">
<input name="thread" value="{html.escape(suggestion, quote=True)}" required
 pattern="[\\p{{L}}\\p{{M}}\\p{{Nd}}._\\-]{{1,200}}" title="{html.escape(NAME_RULE, quote=True)}"
 aria-label="thread id">
<input type="hidden" name="space" value="{esc_space}">
<button type="submit">Open thread</button>
</form>
{body}
</body>
</html>
"""


def login_page(*, after: str, error: str = "") -> str:
    """The sign-in form (no script): a token's secret, posted to ``login``; then `after`."""
    said = f'<p class="error" role="alert">{html.escape(error)}</p>' if error else ""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sign in - web threads</title>
<style>{_STYLE}</style>
</head>
<body>
<header><h1>Sign in</h1><span class="status">web threads</span></header>
<form class="compose" method="post" action="login">
<input name="token" type="password" required autocomplete="current-password"
 placeholder="your token" aria-label="token">
<input type="hidden" name="next" value="{html.escape(after, quote=True)}">
<button type="submit">Sign in</button>
{said}
</form>
</body>
</html>
"""
