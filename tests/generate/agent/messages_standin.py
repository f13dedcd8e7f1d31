"""A small local stand-in of Anthropic's Messages API, for driving the real `anthropic` client in tests.

POST /v1/messages on 127.0.0.1:<free port>, faithful where our agent depends on it:
- request validation: an API key (x-api-key, or Authorization: Bearer as anthropic 2.x sends it) and
  the anthropic-version header; model, max_tokens, messages required;
  roles alternate starting with user; every tool_use of the previous assistant turn answered by a
  tool_result with its id (and no stray ids); tool definitions well-formed; at most 4 cache_control
  breakpoints. Violations answer 400 in Anthropic's error shape
  {"type": "error", "error": {"type": "invalid_request_error", "message": ...}}.
- responses: {id, type: "message", role: "assistant", model, content: [text | tool_use{id,name,input}],
  stop_reason: "tool_use" | "end_turn" | ..., stop_sequence, usage{input_tokens, output_tokens,
  cache_creation_input_tokens, cache_read_input_tokens}}.
- prompt caching: the prefix (tools, system, messages, in that order) up to each cache_control
  breakpoint is remembered; a later request whose prefix up to a breakpoint, or up to a block
  boundary at most 20 blocks before its last breakpoint, was remembered reads it from the "cache"
  (cache_read_input_tokens), the rest up to the last breakpoint is written
  (cache_creation_input_tokens); input_tokens is what follows. Tokens are estimated as ceil(characters / 4).

Turns are SCRIPTED: a script (JSON file or dict) holds conversations, each chosen by a `match`
substring of the first user message; the turn played is the number of assistant messages in the
request (stateless, so parallel agents each get their own conversation). A turn:
  {"content": [{"type": "text", "text": ...} | {"type": "tool_use", "name": ..., "input": {...}}],
   "stop_reason": "tool_use" | "end_turn" (default: tool_use when there are tool_use blocks),
   "usage": {...optional overrides}, "expect": "substring the last tool_result must contain",
   "error": {"status": 529, "type": "overloaded_error", "message": "..."}  (answer with an error)}
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BLOCK_TYPES = {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class BadRequest(Exception):
    pass


def _tokens(obj) -> int:
    return math.ceil(len(json.dumps(obj, sort_keys=True)) / 4)


def _strip_cc(obj):
    if isinstance(obj, dict):
        return {k: _strip_cc(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [_strip_cc(v) for v in obj]
    return obj


class MessagesStandin:
    def __init__(self, script: dict | str | Path):
        if not isinstance(script, dict):
            script = json.loads(Path(script).read_text())
        self.script = script
        self.requests: list[dict] = []
        self.expect_failures: list[str] = []
        self._cache: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    # ---------------------------------------------------------------- validation

    def validate(self, headers, body) -> None:
        auth = headers.get("authorization", "")
        if not headers.get("x-api-key") and not (auth.startswith("Bearer ") and auth[7:].strip()):
            raise PermissionError("an API key is required (x-api-key header or Authorization: Bearer)")
        if not headers.get("anthropic-version"):
            raise BadRequest("anthropic-version: header is required")
        if not isinstance(body, dict):
            raise BadRequest("body: must be a JSON object")
        for k in ("model", "max_tokens", "messages"):
            if k not in body:
                raise BadRequest(f"{k}: Field required")
        if not isinstance(body["model"], str) or not body["model"]:
            raise BadRequest("model: must be a non-empty string")
        if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
            raise BadRequest("max_tokens: must be an integer >= 1")
        msgs = body["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("messages: at least one message is required")
        n_cc = 0
        for t in body.get("tools") or []:
            if not isinstance(t, dict) or not TOOL_NAME.match(str(t.get("name", ""))):
                raise BadRequest(f"tools: bad tool name {t.get('name') if isinstance(t, dict) else t!r}")
            if not isinstance(t.get("input_schema"), dict) or t["input_schema"].get("type") != "object":
                raise BadRequest(f"tools.{t['name']}.input_schema: must be a JSON schema of type object")
            n_cc += "cache_control" in t
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            if not isinstance(system, list) or not all(isinstance(b, dict) and b.get("type") == "text" for b in system):
                raise BadRequest("system: must be a string or a list of text blocks")
            n_cc += sum("cache_control" in b for b in system)
        prev_tool_ids: set[str] = set()
        for i, m in enumerate(msgs):
            role = m.get("role") if isinstance(m, dict) else None
            want = "user" if i % 2 == 0 else "assistant"
            if role != want:
                raise BadRequest(f"messages.{i}.role: expected {want!r} (roles must alternate, starting with user), got {role!r}")
            content = m.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if not isinstance(blocks, list) or not blocks:
                raise BadRequest(f"messages.{i}.content: must be a string or a non-empty list of blocks")
            ids_here = set()
            for j, b in enumerate(blocks):
                if not isinstance(b, dict) or b.get("type") not in BLOCK_TYPES:
                    raise BadRequest(f"messages.{i}.content.{j}.type: unknown block type {b.get('type') if isinstance(b, dict) else b!r}")
                n_cc += "cache_control" in b
                if b["type"] == "tool_result":
                    if role != "user":
                        raise BadRequest(f"messages.{i}.content.{j}: tool_result only in user messages")
                    if b.get("tool_use_id") not in prev_tool_ids:
                        raise BadRequest(f"messages.{i}.content.{j}: unexpected `tool_use_id` {b.get('tool_use_id')!r}: "
                                         "tool_result blocks must answer a tool_use of the previous message")
                    ids_here.add(b["tool_use_id"])
                if b["type"] == "tool_use" and role != "assistant":
                    raise BadRequest(f"messages.{i}.content.{j}: tool_use only in assistant messages")
            if role == "user" and prev_tool_ids - ids_here:
                raise BadRequest(f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                                 f"after: {sorted(prev_tool_ids - ids_here)}")
            prev_tool_ids = {b["id"] for b in blocks if b.get("type") == "tool_use"} if role == "assistant" else set()
        if msgs[-1]["role"] != "user":
            raise BadRequest("messages: the last message must be from the user in this stand-in")
        if n_cc > 4:
            raise BadRequest(f"A maximum of 4 blocks with cache_control may be provided. Found {n_cc}.")

    # ---------------------------------------------------------------- usage with prompt caching

    def usage(self, body) -> dict:
        items = [("tool", t) for t in body.get("tools") or []]
        system = body.get("system")
        if isinstance(system, str):
            items.append(("system", {"type": "text", "text": system}))
        elif system:
            items += [("system", b) for b in system]
        for m in body["messages"]:
            c = m["content"]
            for b in ([{"type": "text", "text": c}] if isinstance(c, str) else c):
                items.append((m["role"], b))
        running, h = 0, hashlib.sha256()
        prefixes = []  # (prefix hash, prefix tokens, is a breakpoint) at every block boundary
        for role, b in items:
            h.update(json.dumps([role, _strip_cc(b)], sort_keys=True).encode())
            running += _tokens(_strip_cc(b))
            prefixes.append((h.hexdigest(), running, isinstance(b, dict) and "cache_control" in b))
        total = running
        bps = [i for i, p in enumerate(prefixes) if p[2]]
        read = created = 0
        with self._lock:
            if bps:
                # Like the API: a breakpoint also hits an earlier cached prefix (up to 20 blocks back).
                for i in range(bps[-1], max(-1, bps[-1] - 21), -1):
                    if prefixes[i][0] in self._cache:
                        read = prefixes[i][1]
                        break
                for i in bps[:-1]:
                    if prefixes[i][0] in self._cache:
                        read = max(read, prefixes[i][1])
                created = max(0, prefixes[bps[-1]][1] - read)
                for i in bps:
                    self._cache.add(prefixes[i][0])
        return {"input_tokens": total - read - created, "cache_creation_input_tokens": created,
                "cache_read_input_tokens": read}

    # ---------------------------------------------------------------- scripted turns

    def pick(self, body) -> tuple[str, list[dict]]:
        first = body["messages"][0]["content"]
        text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first if isinstance(b, dict))
        for conv in self.script["conversations"]:
            if conv.get("match", "") in text:
                return conv.get("name", conv.get("match", "")), conv["turns"]
        raise BadRequest("stand-in: no scripted conversation matches the first user message")

    def respond(self, body) -> tuple[int, dict]:
        name, turns = self.pick(body)
        idx = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if idx >= len(turns):
            turn = {"content": [{"type": "text", "text": "(script exhausted)"}], "stop_reason": "end_turn"}
        else:
            turn = turns[idx]
        if "expect" in turn:
            last = body["messages"][-1]["content"]
            got = json.dumps(last) if not isinstance(last, str) else last
            if turn["expect"] not in got:
                self.expect_failures.append(f"{name} turn {idx}: expected {turn['expect']!r} in {got[:400]}")
        if "error" in turn:
            e = turn["error"]
            return e.get("status", 500), {"type": "error", "error": {"type": e.get("type", "api_error"),
                                                                      "message": e.get("message", "scripted error")}}
        content = []
        for b in turn["content"]:
            b = dict(b)
            if b["type"] == "tool_use":
                b.setdefault("id", "toolu_" + uuid.uuid4().hex[:24])
                b.setdefault("input", {})
            content.append(b)
        stop = turn.get("stop_reason") or ("tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn")
        usage = {**self.usage(body), "output_tokens": _tokens(content)}
        usage.update(turn.get("usage", {}))
        return 200, {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                     "model": body["model"], "content": content, "stop_reason": stop, "stop_sequence": None,
                     "usage": usage}

    # ---------------------------------------------------------------- HTTP

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, status: int, obj: dict):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("request-id", "req_" + uuid.uuid4().hex[:16])
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                if self.path.split("?")[0] != "/v1/messages":
                    return self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": f"Not found: {self.path}"}})
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw or b"null")
                except json.JSONDecodeError as e:
                    return self._send(400, {"type": "error", "error": {"type": "invalid_request_error", "message": f"invalid JSON: {e}"}})
                with standin._lock:
                    standin.requests.append(body)
                try:
                    standin.validate({k.lower(): v for k, v in self.headers.items()}, body)
                    status, obj = standin.respond(body)
                except PermissionError as e:
                    status, obj = 401, {"type": "error", "error": {"type": "authentication_error", "message": str(e)}}
                except BadRequest as e:
                    status, obj = 400, {"type": "error", "error": {"type": "invalid_request_error", "message": str(e)}}
                self._send(status, obj)

        return Handler


def reader_script(n_reads: int, match: str = "Strategy: fuse", usage: dict | None = None,
                  path: str = "src/pkg/mod.py") -> dict:
    """A conversation that reads `path` n_reads times, one read_file per turn, then ends its turn
    without changing anything."""
    read = {"type": "tool_use", "name": "read_file", "input": {"path": path}}
    turns = [{"content": [{"type": "text", "text": f"look {i}"}, read], **({"usage": usage} if usage else {})}
             for i in range(n_reads)]
    turns.append({"content": [{"type": "text", "text": "nothing to change"}], "stop_reason": "end_turn"})
    return {"conversations": [{"match": match, "turns": turns}]}
