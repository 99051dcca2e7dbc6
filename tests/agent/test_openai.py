"""The openai proposer against a real OpenAI-compatible HTTP server on loopback: a 429, a 500, a non-JSON body and
a reply without choices are retried; a malformed and an unknown tool call are answered with the format-error prompt;
read_file, write_file and submit do their work; tokens and cost reach the index and --cost-limit stops the run."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.agent.conftest import index, ledger_rows, run_agent, runs

USAGE = {"prompt_tokens": 300, "completion_tokens": 50, "total_tokens": 350}


def tool_call(name: str, arguments: str, number: int) -> tuple[int, str, dict]:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{number}", "type": "function", "function": {"name": name, "arguments": arguments}}]}
    body = {"id": f"chatcmpl-{number}", "object": "chat.completion", "created": 0, "model": "test-model",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "usage": USAGE}
    return 200, "application/json", body


class Endpoint(ThreadingHTTPServer):
    def __init__(self, replies: list[tuple[int, str, object]]):
        super().__init__(("127.0.0.1", 0), Handler)
        self.replies, self.requests = replies, []


class Handler(BaseHTTPRequestHandler):
    server: Endpoint

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "body": body})
        status, content_type, payload = self.server.replies.pop(0)
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_openai_proposer_against_a_loopback_endpoint(project: Path, panel: Path):
    solution = (project / "methods" / "main" / "solution.py").read_text().replace('"BLOCK_SIZE_N": 64',
                                                                                 '"BLOCK_SIZE_N": 128')
    error = {"error": {"message": "slow down", "type": "rate_limit"}}
    replies = [
        (429, "application/json", error),
        (500, "application/json", {"error": {"message": "upstream crashed"}}),
        (200, "text/html", "<html>a proxy error page</html>"),
        (200, "application/json", {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}),
        tool_call("read_file", json.dumps({"path": "spec"}), 1),
        tool_call("read_file", "{this is not json", 2),
        tool_call("delete_everything", "{}", 3),
        tool_call("read_file", json.dumps({"path": "evals/problems/visible_cases.json"}), 4),
        tool_call("write_file", json.dumps({"path": "methods/main/solution.py", "content": solution}), 5),
        tool_call("submit", json.dumps({"summary": "BLOCK_SIZE_N 64->128", "hypothesis": "fewer re-reads of x"}), 6),
    ]
    server = Endpoint(replies)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run_agent(project, "run", "--iters", "3", "--backend", "auto", "--model", "test-model", "--panel", str(panel),
                  "--cost-limit", "0.5", OPENAI_BASE_URL=f"http://127.0.0.1:{server.server_port}/v1",
                  OPENAI_API_KEY="test", KLOOP_RETRY_BASE_S="0.01", KLOOP_PRICE_PER_MTOK="1000,1000")
    finally:
        server.shutdown()
    assert not replies, "every scripted reply was consumed"
    assert all(r["path"] == "/v1/chat/completions" and r["body"]["model"] == "test-model" for r in server.requests)
    assert {t["function"]["name"] for t in server.requests[0]["body"]["tools"]} >= {"read_file", "write_file", "submit"}

    def last_tool_reply(request: int) -> str:
        return server.requests[request]["body"]["messages"][-1]["content"]

    assert "W4A16" in last_tool_reply(5)  # the spec was read
    assert "could not be executed" in last_tool_reply(6) and "not JSON" in last_tool_reply(6)
    assert "could not be executed" in last_tool_reply(7) and "unknown tool 'delete_everything'" in last_tool_reply(7)
    assert "refused" in last_tool_reply(8)  # evaluator internals stay out of reach
    assert "wrote" in last_tool_reply(9)

    rows = ledger_rows(project)[1:]
    assert len(rows) == 1 and " | openai/test-model | " in rows[0] and "BLOCK_SIZE_N 64->128" in rows[0]
    (entry,) = index(project)
    assert entry["tokens"] == 6 * 350 and entry["prompt_tokens"] == 6 * 300
    assert abs(entry["cost_usd"] - 6 * 350 * 1000 / 1e6) < 1e-9
    assert entry["verdict"]["correct"]
    (state,) = runs(project)
    assert state["status"] == "stopped" and state["attempts"] == 1  # the cost limit ($0.50 < $2.10) stopped it
