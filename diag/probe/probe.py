"""One probe of a live server: detect the engine, scrape /metrics, send every prompt, scrape
again, and save what `diag run --server-*` reads, atomically, in one folder.

What is sent and saved is the engine's (its LiveServer, diag/engines/<family>/live.py, found
by detect.py): one record per prompt in its rows_file, the files its `finish` keeps, and the
ServerSpec field each one feeds (the `diag run` flag: --server-responses, --server-info,
--server-metrics). Every engine: metrics_before.txt, metrics_after.txt (the raw scrapes;
metrics.txt is their difference, diag.engines.prometheus), probe.json (what was sent, to whom,
and when).

Requests run `concurrency` at a time (a thread pool); the first failure stops the probe and
nothing is written. Worked example: 48 prompts, concurrency 8 -> 48 POSTs, then metrics.txt
with the counters of these 48 requests (plus any other client's traffic during the probe,
which probe.json's notes count where the engine's requests_total counter reports it).
This module joins the others; it knows no engine's JSON and names no engine.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from diag.engines import prometheus
from diag.engines.protocol import LiveServer
from diag.errors import DiagError
from diag.probe.client import Client
from diag.probe.detect import Server, check_engine, detect, live
from diag.probe.plan import ProbePlan, ProbePrompt
from diag.report.outdir import check_out_dir, partial_dir, swap_into_place, write_manifest

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
        flags = live(self.server.engine).run_flags
        return [x for field, path in self.files.items() for x in (flags[field], path)]


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


def check_model_labels(text: str, model: str | None, url: str, prefix: str) -> None:
    """Every `model_name` label on the engine's samples (names starting with `prefix`, the
    family and a colon) names the model probed; a scrape from another model (a proxy, a
    second server on the port) is refused."""
    if model is None:
        return
    others = sorted(prometheus.label_values(text, "model_name", prefix) - {model})
    if others:
        raise DiagError("the /metrics scrape is from another model", file=url, field='model_name="..."',
                        expected=f'model_name="{model}" (the model the probe sent to)', found=others,
                        hint="scrape the server that answered the requests (one model per server)")


def _other_traffic(delta_text: str, engine: LiveServer, sent: int) -> list[str]:
    done = prometheus.total(delta_text, engine.requests_total)
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
    engine = live(server.engine)
    prefix, metrics_url = f"{server.engine}:", client.base + "/metrics"
    probed, kept = engine.served_model(client, server, model)
    before = _metrics(client)
    if before is not None:
        check_model_labels(before, probed, metrics_url, prefix)
    start = time.monotonic()
    rows = _send_all(client, plan, lambda p: engine.request(p, plan.decoding, plan.max_new_tokens, probed),
                     engine.record, engine.generate_path, concurrency, progress)
    files, fields, notes = engine.finish(client, server, rows)
    files = {engine.rows_file: _jsonl(rows), **files, **kept}
    wall = time.monotonic() - start
    after = _metrics(client)
    delta = None
    if before is not None and after is not None:
        check_model_labels(after, probed, metrics_url, prefix)
        delta = prometheus.delta(before, after)
        files.update({"metrics_before.txt": before, "metrics_after.txt": after, "metrics.txt": delta})
        notes += _other_traffic(delta, engine, len(plan.prompts))
    more_fields, more_notes = engine.metrics_fields(delta, metrics_url)
    fields.update(more_fields)
    notes += more_notes
    manifest = _manifest(plan, server, probed, client, concurrency, wall, engine.run_flags, fields, notes)
    _write(out, {**files, "probe.json": json.dumps(manifest, indent=2) + "\n"})
    return ProbeResult(out, server, probed, {f: str(out / name) for f, name in fields.items()}, len(plan.prompts),
                       wall, tuple(notes))


def _manifest(plan: ProbePlan, server: Server, model, client: Client, concurrency: int, wall: float,
              run_flags: dict[str, str], fields: dict, notes: list[str]) -> dict:
    return {"kind": "diag-probe", "version": 1, "server": client.base, "engine": server.engine,
            "engine_version": server.version, "model": model,
            "prompts": {"file": plan.prompt_file, "sha256": plan.prompt_sha256, "count": len(plan.prompts),
                        "sent_as": plan.sent_as, "rendering": plan.rendering},
            "decoding": plan.decoding.to_dict(), "decoding_source": plan.decoding_source,
            "max_new_tokens": plan.max_new_tokens, "concurrency": concurrency, "timeout_s": client.timeout,
            "retries": client.retries, "wall_s": round(wall, 3),
            "run_inputs": {run_flags[f]: name for f, name in fields.items()}, "notes": notes}


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
