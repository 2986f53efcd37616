"""Plots cached by content: a repeat run whose report data did not change copies its PNGs
instead of drawing them (matplotlib took 4.6 s of the H200 bench's cached run, 6-10 s on the
shared 2-core CPU, for 4 figures of 6 panels).

A plot is a pure function of the report dict (plots.py draws byte-for-byte repeatable PNGs
from it alone), so its key hashes:
  the plot's name and the report keys it reads (plots.READS: the evaluation plots read
    "evaluations" alone; a plot not listed there, the whole report but for "created",
    "timings" and "target_pass", which no plot reads and every run changes),
  the source of plots.py (any change to how a plot is drawn is another key), and the
    matplotlib version.
Worked example: a cached repeat run -> "evaluations" as before -> its 3 figures copied (the
diagnoses' plots, the speedup plot among them, drawn every time); one
more layout -> "evaluations" changed -> every figure with a panel per tree is drawn again.
Entry: $DIAG_CACHE_DIR/plots/<digest>.png and <digest>.json {"key", "file", "title",
"sha256" of the PNG}; the JSON is written last, both through a temporary file renamed into
place, and an entry is believed only when the PNG's sha256 matches (else drawn again). A
cache that cannot be written costs the drawing, never the report.
A registered diagnosis's plots (diag/diagnoses/) are cached the same way, all of one diagnosis
under one key: its name, its section and the report keys it declares (Diagnosis.plot_reads),
the source of its module (or package) and of report/figure.py, and the matplotlib version; the
entry lists its PNGs (<digest>-<i>.png), each checked by sha256.
The figures to draw, the report's and the diagnoses' alike, are drawn in parallel, one process
each (this one draws the first, forked ones the others), on a machine with at least
PARALLEL_CPUS cores (the H200 host's 16: one more layout misses 4 figures,
acceptance_at_depth, accept_hist, by_position and the pricing diagnosis's speedup.png, drawn
in the time of the slowest instead of their sum); on fewer cores, one after another. The
garbage collector is paused while a figure is drawn (and the parent's objects frozen before
the fork): its collections walk the process's whole heap and free nothing of a figure's.
A PNG is the same bytes either way.
This module knows files, hashes and processes; the drawing is plots.py's.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from diag.checkpoint.identity import cache_root

_UNREAD = ("created", "timings", "target_pass")     # no plot reads these; every run changes them
PARALLEL_CPUS = 4


@functools.cache
def _code() -> str:
    """The drawing code's identity: plots.py's source and matplotlib's version, read from its
    metadata (importing matplotlib costs 0.3-1.5 s, and a run whose plots are all cached draws none)."""
    from importlib.metadata import version

    from diag.report import plots
    return hashlib.sha256(Path(plots.__file__).read_bytes()).hexdigest() + version("matplotlib")


def plot_key(name: str, rep: dict) -> str:
    from diag.report.plots import READS

    reads = READS.get(name)
    body = {k: v for k, v in rep.items() if (k in reads if reads is not None else k not in _UNREAD)}
    blob = json.dumps([name, _code(), body], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _entry(key: str) -> tuple[dict, bytes] | None:
    """A report plot's cache entry and PNG, or None when absent, damaged or another key's."""
    base = cache_root() / "plots" / key
    try:
        entry = json.loads(base.with_suffix(".json").read_text())
        png = base.with_suffix(".png").read_bytes()
    except (OSError, ValueError):
        return None
    if entry.get("key") != key or hashlib.sha256(png).hexdigest() != entry.get("sha256"):
        return None
    return entry, png


def _cached(key: str, folder: Path) -> dict | None:
    hit = _entry(key)
    if hit is None:
        return None
    entry, png = hit
    (folder / "plots").mkdir(parents=True, exist_ok=True)
    (folder / entry["file"]).write_bytes(png)
    return {"file": entry["file"], "title": entry["title"]}


def cached_plot(plot: Callable[[dict, Path], dict | None], rep: dict, folder: Path,
                key: str | None = None) -> dict | None:
    """plot(rep, folder), or its PNG copied from the cache when drawn before from the same data
    (a plot named in plots.UNCACHED is always drawn); `key`: plot_key's, when known."""
    from diag.report.plots import UNCACHED

    if plot.__name__ in UNCACHED:
        return plot(rep, folder)
    key = key or plot_key(plot.__name__, rep)
    hit = _cached(key, folder)
    if hit is not None:
        return hit
    with _no_gc():
        made = plot(rep, folder)
    if made is None:
        return None
    png = (folder / made["file"]).read_bytes()
    base = cache_root() / "plots" / key
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        _atomic(base.with_suffix(".png"), png)
        _atomic(base.with_suffix(".json"), json.dumps({"key": key, **made,
                                                       "sha256": hashlib.sha256(png).hexdigest()}).encode())
    except OSError:
        pass                             # an unwritable cache: drawn again next time
    return made


@contextlib.contextmanager
def _no_gc():
    """The cyclic garbage collector paused while matplotlib draws: a figure allocates some
    10^5 objects, and each collection they trigger walks the whole heap of the process (the
    run's records, torch's modules), to find nothing (a figure is freed when it is dropped).
    What is drawn does not depend on it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_JOBS: list = []            # the forked workers' drawings, by index (inherited, never pickled)


def _draw(i: int) -> None:
    """Worker: draw job i into the cache (a report plot, or one diagnosis's plots)."""
    job = _JOBS[i]
    if job[0] == "plot":
        _, plot, rep, folder, key = job
        cached_plot(plot, rep, folder, key)
    else:
        _, d, sec, rep, folder = job
        cached_diagnosis_plots(d, sec, rep, folder)


def _misses(plots, rep: dict, folder: Path, keys: dict) -> list[tuple]:
    """What the cache lacks, in report order: ("plot", plot, rep, folder, key) for a report
    plot, ("diagnosis", d, sec, rep, folder) for a registered diagnosis's (plots.PLACES: the
    places whose diagnoses' plots the report shows)."""
    from diag.diagnoses.hooks import plots_all
    from diag.report.plots import PLACES

    jobs = [("plot", p, rep, folder, keys[p.__name__]) for p in plots
            if p.__name__ in keys and _entry(keys[p.__name__]) is None]

    def note(d, sec, rep, folder) -> list:
        if _diagnosis_entry(diagnosis_plot_key(d, rep)) is None:
            jobs.append(("diagnosis", d, sec, rep, folder))
        return []
    for p in plots:
        if p.__name__ in PLACES:
            plots_all(rep, folder, PLACES[p.__name__], draw=note)
    return jobs


def draw_all(plots, rep: dict, folder: Path, *, workers: int | None = None,
             stats: dict | None = None) -> list[dict | None]:
    """cached_plot of every plot, in order; the figures not in the cache (the report's and the
    diagnoses') drawn by `workers` processes at once, this one and workers - 1 forked (default:
    one per figure on a machine of PARALLEL_CPUS cores or more), then copied from the cache
    like the others. `stats`, when given and drawing in parallel, receives figures_drawn and
    figure_workers.
    Example: one more layout on the H200 host -> acceptance_at_depth, accept_hist, by_position
    and the pricing diagnosis's speedup.png all miss -> this process draws the first, 3 forked
    ones the others, at once."""
    from diag.report.plots import UNCACHED

    keys = {p.__name__: plot_key(p.__name__, rep) for p in plots if p.__name__ not in UNCACHED}
    parallel = workers > 1 if workers is not None else (os.cpu_count() or 1) >= PARALLEL_CPUS
    todo = _misses(plots, rep, folder, keys) if parallel else []
    workers = min(workers or len(todo), len(todo))
    if stats is not None and parallel:          # on fewer cores the misses are found while drawing
        stats.update(figures_drawn=len(todo), figure_workers=max(workers, 1 if todo else 0))
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        import diag.report.figure  # noqa: F401  (matplotlib loaded once, before the fork: no worker imports it)

        _JOBS[:] = todo
        gc.freeze()             # the parent's objects: not walked by the workers' collector, nor copied on write
        try:                    # workers - 1 forks (each copies the parent's page tables: 70 ms at 4 GB)
            with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("fork")) as pool:
                rest = [pool.submit(_draw, i) for i in range(1, len(todo))]     # forked at the first submit
                _draw(0)                                    # the parent draws the first meanwhile
                for f in rest:
                    f.result()                              # each drawn into the cache
        finally:
            gc.unfreeze()
            _JOBS.clear()
    return [cached_plot(p, rep, folder, keys.get(p.__name__)) for p in plots]


def _diagnosis_code(d) -> str:
    return _class_code(type(d))


@functools.cache
def _class_code(cls) -> str:
    """A diagnosis's drawing code: its module (every module of its package), report/figure.py
    (read as a file: importing it imports matplotlib) and matplotlib's version; read once a
    process, as plots.py's is (_code)."""
    import inspect
    from importlib.metadata import version

    src = Path(inspect.getfile(cls))
    files = sorted(src.parent.glob("*.py")) if src.name == "__init__.py" else [src]
    digest = hashlib.sha256()
    for f in [*files, Path(__file__).with_name("figure.py")]:
        digest.update(f.read_bytes())
    return digest.hexdigest() + version("matplotlib")


def diagnosis_plot_key(d, rep: dict) -> str:
    body = {k: rep.get(k) for k in (d.key, *d.plot_reads)}
    blob = json.dumps(["diagnosis", d.name, _diagnosis_code(d), body], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _diagnosis_entry(key: str) -> tuple[dict, list[bytes]] | None:
    """A diagnosis's cache entry and its PNGs, or None when absent, damaged or another key's."""
    base = cache_root() / "plots" / key
    try:
        entry = json.loads(base.with_suffix(".json").read_text())
        pngs = [(base.parent / f"{key}-{i}.png").read_bytes() for i in range(len(entry["plots"]))]
        if entry.get("key") == key and all(hashlib.sha256(png).hexdigest() == p["sha256"]
                                           for png, p in zip(pngs, entry["plots"])):
            return entry, pngs
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def cached_diagnosis_plots(d, sec, rep: dict, folder: Path) -> list[dict]:
    """d.plots(sec, rep, folder), or its PNGs copied from the cache when drawn before from the
    same section (module docstring)."""
    key = diagnosis_plot_key(d, rep)
    hit = _diagnosis_entry(key)
    if hit is not None:
        entry, pngs = hit
        if pngs:
            (folder / "plots").mkdir(parents=True, exist_ok=True)
        for png, p in zip(pngs, entry["plots"]):
            (folder / p["file"]).write_bytes(png)
        return [{"file": p["file"], "title": p["title"]} for p in entry["plots"]]
    with _no_gc():
        made = d.plots(sec, rep, folder)
    base = cache_root() / "plots" / key
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        listed = []
        for i, m in enumerate(made):
            png = (folder / m["file"]).read_bytes()
            _atomic(base.parent / f"{key}-{i}.png", png)
            listed.append({**m, "sha256": hashlib.sha256(png).hexdigest()})
        _atomic(base.with_suffix(".json"), json.dumps({"key": key, "plots": listed}).encode())
    except OSError:
        pass                             # an unwritable cache: drawn again next time
    return made
