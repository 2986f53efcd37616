"""One probe of a live server: detect the engine, scrape /metrics, send every prompt, scrape
again, and save what `diag run --server-*` reads, atomically, in one folder.

Saved (the ServerSpec field each one feeds, i.e. the `diag run` flag):
  SGLang  responses.jsonl  -> responses (--server-responses), one /generate answer per prompt
          server_info.json -> server_info (--server-info), GET /server_info after the probe
  vLLM    metrics.txt      -> vllm_metrics (--server-metrics), the counters of this probe only
          completions.jsonl, models.json, version.json (what was answered; not read by run)
  both    metrics_before.txt, metrics_after.txt (the raw scrapes; metrics.txt is their
          difference, diag.probe.prometheus), probe.json (what was sent, to whom, and when)
/server_info's avg_spec_accept_length is the server's lifetime average, not this probe's; the
per-request counts in responses.jsonl are this probe's.

Requests run `concurrency` at a time (a thread pool); the first failure stops the probe and
nothing is written. Worked example: 48 prompts, concurrency 8, vLLM -> 48 POSTs, then
metrics.txt with num_drafts 558 etc. for these 48 requests (plus any other client's
traffic during the probe, which probe.json's notes count when vLLM reports it).
This module joins the others; it knows no engine's JSON itself.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from diag.errors import DiagError
from diag.probe import prometheus, sglang_shape, vllm_shape
from diag.probe.client import Client
from diag.probe.detect import Server, check_engine, detect
from diag.probe.plan import ProbePlan, ProbePrompt
from diag.report.outdir import check_out_dir, partial_dir, swap_into_place, write_manifest

RUN_FIELDS = {"responses": "--server-responses", "server_info": "--server-info", "vllm_metrics": "--server-metrics"}


@dataclass(frozen=True)
class ProbeResult:
    out: Path
    server: Server
    model: str | None
    files: dict[str, str]           # ServerSpec field -> saved path (absolute)
    requests: int
    wall_s: float
    notes: tuple[str, ...]

    def run_flags(self) -> list[str]:
        return [x for field, path in self.files.items() for x in (RUN_FIELDS[field], path)]


def _send_all(client: Client, plan: ProbePlan, body, record, path: str, concurrency: int,
              progress: bool) -> list[dict]:
    """POST each prompt's body; the records in prompt order. The first failure stops the rest."""
    from tqdm import tqdm

    def one(p: ProbePrompt) -> dict:
        try:
            return record(p, client.post(path, body(p)).json(), client.base + path)
        except DiagError as err:
            raise DiagError(f"prompt {p.id}: {err.message}", file=err.file, field=err.field, expected=err.expected,
                            found=err.found, hint=err.hint) from None

    out: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=concurrency) as pool, \
            tqdm(total=len(plan.prompts), desc=f"probe {client.base}", unit="req", disable=not progress) as bar:
        futures = {pool.submit(one, p): p.id for p in plan.prompts}
        try:
            for fut in as_completed(futures):
                out[futures[fut]] = fut.result()
                bar.update()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [out[p.id] for p in plan.prompts]


def _metrics(client: Client) -> str | None:
    reply = client.get("/metrics", ok_missing=True)
    return reply.text if reply is not None else None


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _sglang(client: Client, server: Server, plan: ProbePlan, concurrency: int,
            progress: bool) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(files to write, ServerSpec field -> file name, notes)."""
    rows = _send_all(client, plan, lambda p: sglang_shape.request(p, plan.decoding, plan.max_new_tokens),
                     sglang_shape.record, "/generate", concurrency, progress)
    sglang_shape.check_speculated(rows, client.base + "/generate")
    info = client.get(server.info_path or "/server_info")
    files = {"responses.jsonl": _jsonl(rows), "server_info.json": info.text}
    notes = ["server_info.json: avg_spec_accept_length is the server's lifetime average; responses.jsonl "
             "holds this probe's own counts"]
    return files, {"responses": "responses.jsonl", "server_info": "server_info.json"}, notes


def _vllm(client: Client, plan: ProbePlan, model: str, concurrency: int,
          progress: bool) -> tuple[dict[str, str], dict[str, str], list[str]]:
    rows = _send_all(client, plan, lambda p: vllm_shape.request(p, plan.decoding, plan.max_new_tokens, model),
                     vllm_shape.record, "/v1/completions", concurrency, progress)
    version = client.get("/version")
    return {"completions.jsonl": _jsonl(rows), "version.json": version.text}, {}, []


def _model(client: Client, server: Server, model: str | None) -> tuple[str | None, dict[str, str]]:
    """The model the requests go to (checked against what the server serves), and files to keep."""
    if server.engine == "vllm":
        models = client.get("/v1/models")
        return vllm_shape.served_model(models.json(), model, client.base + "/v1/models"), \
            {"models.json": models.text}
    if model is not None and server.model is not None and model != server.model:
        raise DiagError("the server does not serve the model named", file=server.url, field="--model",
                        expected=model, found=server.model)
    return model or server.model, {}


def _other_traffic(delta_text: str, engine: str, sent: int) -> list[str]:
    name = {"vllm": "vllm:request_success_total", "sglang": "sglang:num_requests_total"}[engine]
    done = prometheus.total(delta_text, name)
    if done is not None and done > sent:
        return [f"{int(done - sent)} requests of other clients finished during the probe; the /metrics "
                "counters include them"]
    return []


def probe(plan: ProbePlan, client: Client, out: str | Path, *, engine: str | None = None, model: str | None = None,
          concurrency: int = 8, progress: bool = True, server: Server | None = None) -> ProbeResult:
    """Probe the server at client.base with `plan` and save into `out` (the module docstring);
    `server`: what detect() already found."""
    if concurrency < 1:
        raise DiagError("concurrency must be at least 1", field="--concurrency", expected=">= 1", found=concurrency)
    out = check_out_dir(out)
    server = server or detect(client)
    check_engine(server, engine)
    prefix = f"{server.engine}:"
    probed, kept = _model(client, server, model)
    before = _metrics(client)
    if before is not None:
        vllm_shape.check_model_labels(before, probed, client.base + "/metrics", prefix)
    start = time.monotonic()
    if server.engine == "sglang":
        files, fields, notes = _sglang(client, server, plan, concurrency, progress)
    else:
        files, fields, notes = _vllm(client, plan, probed, concurrency, progress)
    files.update(kept)
    wall = time.monotonic() - start
    after = _metrics(client)
    if before is not None and after is not None:
        vllm_shape.check_model_labels(after, probed, client.base + "/metrics", prefix)
        delta = prometheus.delta(before, after)
        files.update({"metrics_before.txt": before, "metrics_after.txt": after, "metrics.txt": delta})
        notes += _other_traffic(delta, server.engine, len(plan.prompts))
        if server.engine == "vllm":
            vllm_shape.check_metrics(delta, f"{client.base}/metrics (after - before this probe)")
            fields["vllm_metrics"] = "metrics.txt"
    elif server.engine == "vllm":
        raise DiagError("the vLLM server has no /metrics", file=client.base + "/metrics",
                        expected="Prometheus text (vLLM serves it unless --disable-log-stats)", found="HTTP 404")
    else:
        notes.append("the SGLang server has no /metrics (launch it with --enable-metrics to save them too)")
    manifest = _manifest(plan, server, probed, client, concurrency, wall, fields, notes)
    _write(out, {**files, "probe.json": json.dumps(manifest, indent=2) + "\n"})
    return ProbeResult(out, server, probed, {f: str(out / name) for f, name in fields.items()}, len(plan.prompts),
                       wall, tuple(notes))


def _manifest(plan: ProbePlan, server: Server, model, client: Client, concurrency: int, wall: float,
              fields: dict, notes: list[str]) -> dict:
    return {"kind": "diag-probe", "version": 1, "server": client.base, "engine": server.engine,
            "engine_version": server.version, "model": model,
            "prompts": {"file": plan.prompt_file, "sha256": plan.prompt_sha256, "count": len(plan.prompts),
                        "sent_as": plan.sent_as, "rendering": plan.rendering},
            "decoding": plan.decoding.to_dict(), "decoding_source": plan.decoding_source,
            "max_new_tokens": plan.max_new_tokens, "concurrency": concurrency, "timeout_s": client.timeout,
            "retries": client.retries, "wall_s": round(wall, 3),
            "run_inputs": {RUN_FIELDS[f]: name for f, name in fields.items()}, "notes": notes}


def _write(out: Path, files: dict[str, str]) -> None:
    tmp = partial_dir(out)
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        write_manifest(tmp)
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
