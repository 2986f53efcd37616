"""Local stand-ins for a live SGLang or vLLM server, for tests/test_probe.py: a stdlib
ThreadingHTTPServer in a thread that answers the routes diag probe asks, in each engine's
shapes (SGLang 0.5.23 http_server.py / tokenizer_manager.py; vLLM 0.32 OpenAI server), and
records every request body.

Per /generate request (SGLang): a chain of 3 (D = 4), rounds = ceil((N - 1) / 2.5) for N =
max_new_tokens, each round accepting a ∈ {2, 1} alternately -> meta_info with the 0.5.23 keys.
Per /v1/completions request (vLLM): 10 drafts, 30 draft tokens, 12 accepted (per position
6, 4, 2) added to the /metrics counters, which start from non-zero values (earlier traffic).
Knobs: fail (the next N POSTs answer 500), delay (seconds before each POST's answer),
metrics_model (the model_name label /metrics carries), rid_echo (False: a random meta_info.id).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Fake:
    def __init__(self, engine: str, *, model: str = "llama-tiny", version: str | None = None):
        self.engine, self.model = engine, model
        self.version = version or {"sglang": "0.5.23", "vllm": "0.32.0"}[engine]
        self.fail, self.delay, self.metrics_model, self.rid_echo = 0, 0.0, model, True
        self.posts: list[tuple[str, dict]] = []
        self.gets: list[str] = []
        self.lock = threading.Lock()
        self.counts = {"num_drafts": 1000, "num_draft_tokens": 3000, "num_accepted_tokens": 1200}
        self.per_pos = [600, 400, 200]
        self.finished = 77
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        self.http.server_close()

    # ---- the engines' answers -------------------------------------------------------------

    def get(self, path: str):
        if self.engine == "sglang":
            if path in ("/server_info", "/get_server_info"):
                return 200, {"model_path": f"/models/{self.model}", "served_model_name": self.model,
                             "version": self.version, "speculative_algorithm": "EAGLE3",
                             "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                             "speculative_num_draft_tokens": 4,
                             "internal_states": [{"avg_spec_accept_length": 2.4}]}
            if path == "/model_info":
                return 200, {"model_path": f"/models/{self.model}", "served_model_name": self.model}
            if path == "/metrics":
                return 200, self.sglang_metrics()
            return 404, {"detail": "Not Found"}
        if path == "/version":
            return 200, {"version": self.version}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "vllm",
                                                     "root": f"/models/{self.model}"}]}
        if path == "/metrics":
            return 200, self.vllm_metrics()
        return 404, {"detail": "Not Found"}

    def post(self, path: str, body: dict):
        if self.engine == "sglang" and path == "/generate":
            return 200, self.generate(body)
        if self.engine == "vllm" and path == "/v1/completions":
            if body.get("model") != self.model:
                return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
            return 200, self.complete(body)
        return 404, {"detail": "Not Found"}

    def generate(self, body: dict) -> dict:
        n = body["sampling_params"]["max_new_tokens"]
        accepted = [2 if i % 2 == 0 else 1 for i in range(n)]
        rounds, made = 0, 1                      # the first token comes from prefill
        while made < n:
            made += accepted[rounds] + 1
            rounds += 1
        acc = sum(accepted[:rounds])
        rid = body.get("rid") if self.rid_echo else uuid.uuid4().hex
        return {"text": " tok" * n, "output_ids": list(range(n)),
                "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": n},
                              "prompt_tokens": len(body.get("input_ids") or body.get("text", "").split()),
                              "completion_tokens": n, "cached_tokens": 0, "spec_verify_ct": rounds,
                              "spec_accept_length": n / rounds, "spec_accept_rate": acc / (3 * rounds),
                              "spec_num_correct_drafts": acc, "spec_num_proposed_drafts": 3 * rounds,
                              "spec_correct_drafts_histogram": [0, rounds - rounds // 2 if rounds else 0,
                                                                rounds // 2, 0]}}

    def complete(self, body: dict) -> dict:
        with self.lock:
            for k, v in (("num_drafts", 10), ("num_draft_tokens", 30), ("num_accepted_tokens", 12)):
                self.counts[k] += v
            self.per_pos = [a + b for a, b in zip(self.per_pos, (6, 4, 2))]
            self.finished += 1
        prompt = body["prompt"]
        return {"id": f"cmpl-{uuid.uuid4().hex[:8]}", "object": "text_completion", "created": 0, "model": self.model,
                "choices": [{"index": 0, "text": " tok" * body["max_tokens"], "logprobs": None,
                             "finish_reason": "length", "stop_reason": None}],
                "usage": {"prompt_tokens": len(prompt) if isinstance(prompt, list) else len(prompt.split()),
                          "completion_tokens": body["max_tokens"], "total_tokens": 0}}

    def vllm_metrics(self) -> str:
        lab = f'engine="0",model_name="{self.metrics_model}"'
        lines = []
        for name, value in self.counts.items():
            lines += [f"# HELP vllm:spec_decode_{name} Number of {name}.", f"# TYPE vllm:spec_decode_{name} counter",
                      f"vllm:spec_decode_{name}_total{{{lab}}} {float(value)}",
                      f"vllm:spec_decode_{name}_created{{{lab}}} 1.7e9"]
        lines += ["# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(v)}'
                  for i, v in enumerate(self.per_pos)]
        lines += ["# TYPE vllm:request_success counter",
                  f'vllm:request_success_total{{{lab},finished_reason="length"}} {float(self.finished)}',
                  "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} 0.0"]
        return "\n".join(lines) + "\n"

    def sglang_metrics(self) -> str:
        lab = f'model_name="{self.metrics_model}"'
        return (f"# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{{{lab}}} 2.4\n"
                f"# TYPE sglang:num_requests counter\nsglang:num_requests_total{{{lab}}} {float(len(self.posts))}\n")

    # ---- HTTP -------------------------------------------------------------------------------

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, body) -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):       # the client gave up (a timeout test)
                    pass

            def do_GET(self):
                fake.gets.append(self.path)
                self._answer(*fake.get(self.path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    failing = fake.fail > 0
                    fake.fail -= failing
                if fake.delay:
                    time.sleep(fake.delay)
                if failing:
                    self._answer(500, {"error": "overloaded"})
                    return
                with fake.lock:
                    fake.posts.append((self.path, body))
                self._answer(*fake.post(self.path, body))

        return Handler
