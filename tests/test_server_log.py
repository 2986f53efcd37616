"""SGLang decode log lines, formatted exactly as each covered release's source formats them, read
back by the release that wrote them; lines a release cannot print are errors naming the line."""

import pytest

from diag.engines.sglang.server_log import parse_decode_line, parse_server_args, read_baseline_log, read_server_log
from diag.engines.sglang.server_releases import LAST_COVERED, rate_formula, server_release, show
from diag.errors import DiagError

COVERED = ["0.5.6", "0.5.7", "0.5.8", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1",
           "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22",
           "0.5.23"]
PREFIX = "[2026-03-01 10:00:00 TP0] "


def msg_0_5_6(n, used, usage, L, R, gen, q, graph="cuda graph", cg=True):
    """managers/scheduler_metrics_mixin.py, 0.5.6-0.5.8 (log_decode_stats)."""
    token_usage_msg = f"#token: {used}, token usage: {usage:.2f}, "
    msg = f"Decode batch, #running-req: {n}, {token_usage_msg}"
    if L is not None:
        msg += f"accept len: {L:.2f}, accept rate: {R:.2f}, "
    msg += (f"{graph}: {cg}, "
            f"gen throughput (token/s): {gen:.2f}, "
            f"#queue-req: {q}, ")
    return msg


def msg_0_5_9(n, used, usage, L, R, gen, q, graph="cuda graph", cg=True, mfu=None):
    """0.5.9 (managers/) and 0.5.10-0.5.10.post1 (observability/scheduler_metrics_mixin.py);
    the MFU suffix exists from 0.5.10 on."""
    msg_parts = [f"#token: {used}, token usage: {usage:.2f}"]
    token_usage_msg = ", ".join(msg_parts) + ", "
    msg = f"Decode batch, #running-req: {n}, {token_usage_msg}"
    if L is not None:
        msg += f"accept len: {L:.2f}, accept rate: {R:.2f}, "
    msg += (f"{graph}: {cg}, "
            f"gen throughput (token/s): {gen:.2f}, "
            f"#queue-req: {q}")
    if mfu is not None:
        msg += (f", est. decode TFLOPS/s (per GPU): {mfu:.2f}, "
                f"est. read BW (GB/s per GPU): {mfu:.2f}, "
                f"est. write BW (GB/s per GPU): {mfu:.2f}")
    return msg


def msg_0_5_11(n, used, usage, L, R, gen, q, graph="cuda graph", cg=True, occupancy=None, cap=0.0, block=0.0):
    """0.5.11-0.5.12.post1 (observability/scheduler_metrics_mixin.py), 0.5.13-0.5.23
    (managers/scheduler_components/metrics_reporter.py); cap / block accept len from 0.5.16."""
    token_usage_msg = ", ".join([f"#token: {used}, token usage: {usage:.2f}"]) + ", "
    msg = f"Decode batch, #running-req: {n}, {token_usage_msg}"
    if L is not None:
        msg += f"accept len: {L:.2f}, accept rate: {R:.2f}, "
        if cap > 0:
            msg += f"cap len: {cap:.2f}, "
        if block > 0:
            msg += f"block accept len: {block:.2f}, "
    msg += (f"{graph}: {cg}, "
            f"gen throughput (token/s): {gen:.2f}, "
            f"#queue-req: {q}")
    if occupancy is not None:
        msg += f", fwd occupancy: {occupancy:.2f}%"
    return msg


def formatter(version: str):
    rel = server_release(version)
    return msg_0_5_6 if rel <= (0, 5, 8, 0) else msg_0_5_9 if rel <= (0, 5, 10, 1) else msg_0_5_11


@pytest.mark.parametrize("version", COVERED)
def test_every_covered_release_reads_its_own_lines(version):
    fmt = formatter(version)
    text = "\n".join([
        "[2026-03-01 09:59:00] server_args=ServerArgs(model_path='/m', speculative_algorithm='EAGLE3', "
        "speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=2, max_running_requests=48)",
        PREFIX + "Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0",
        PREFIX + fmt(8, 5120, 0.03, 1.68, 0.84, 56.8, 0),
        PREFIX + fmt(48, 9000, 0.1, 1.70, 0.85, 410.25, 16),
    ])
    log = read_server_log(text, source="server.log", release=server_release(version))
    assert [(d.running_req, d.accept_len, d.accept_rate, d.gen_throughput, d.queue_req) for d in log.speculative] \
        == [(8, 1.68, 0.84, 56.8, 0), (48, 1.70, 0.85, 410.25, 16)]
    assert log.speculative[0].line_no == 3 and log.speculative[0].rank == "TP0"
    assert log.server_args.tree == (1, 1, 2) and log.server_args.max_running_requests == 48
    assert log.rate_formula == rate_formula(server_release(version))


def test_rate_formula_changes_at_0_5_11():
    assert rate_formula(server_release("0.5.10.post1")) == "sglang_accept_rate_legacy"
    assert rate_formula(server_release("sglang-0.5.11")) == "sglang_accept_rate"


def test_release_specific_suffixes_are_read_and_date_the_line():
    d = parse_decode_line(PREFIX + msg_0_5_9(4, 10, 0.01, 2.2, 0.44, 82.3, 0, mfu=1.5), 1, "f")
    assert d.accept_len == 2.2 and "est. decode TFLOPS" in d.markers and show(d.releases.lo) == "0.5.10"
    d = parse_decode_line(PREFIX + msg_0_5_11(4, 10, 0.01, 2.2, 0.3, 82.3, 0, occupancy=97.5, cap=1.2, block=2.5),
                          1, "f")
    assert (d.accept_len, d.accept_rate, d.gen_throughput) == (2.2, 0.3, 82.3)
    assert {"cap len", "block accept len", "fwd occupancy"} <= set(d.markers) and show(d.releases.lo) == "0.5.16"
    d = parse_decode_line("[2026-03-01 10:00:00 DP1 TP8] " + msg_0_5_11(2, 10, 0.01, None, None, 30.0, 0), 1, "f")
    assert d.rank == "DP1 TP8" and d.accept_len is None


def test_server_args_dict_form_of_0_5_22():
    a = parse_server_args("[t] server_args={'spec': {'speculative_algorithm': 'EAGLE3', 'speculative_num_steps': 3, "
                          "'speculative_eagle_topk': 4, 'speculative_num_draft_tokens': 5}, "
                          "'schedule': {'max_running_requests': None}}", 7)
    assert a.tree == (3, 4, 5) and a.algorithm == "EAGLE3" and a.max_running_requests is None


def test_a_log_without_speculative_lines_is_an_error():
    text = PREFIX + msg_0_5_11(8, 10, 0.01, None, None, 90.0, 0)
    with pytest.raises(DiagError, match="no speculative decode line") as e:
        read_server_log(text, source="plain.log", release=LAST_COVERED)
    assert "1 decode lines without accept len" in str(e.value) and "plain.log" in str(e.value)
    with pytest.raises(DiagError, match="no speculative decode line"):
        read_server_log("hello\nworld\n", source="x.log", release=LAST_COVERED)
    assert read_baseline_log(text, source="plain.log")[0].gen_throughput == 90.0


def test_mixed_releases_in_one_log_are_an_error():
    text = "\n".join([PREFIX + msg_0_5_6(8, 10, 0.01, 1.68, 0.84, 56.8, 0),
                      PREFIX + msg_0_5_11(8, 10, 0.01, 2.2, 0.3, 82.3, 0, cap=1.5)])
    with pytest.raises(DiagError, match="mixes lines of different SGLang releases") as e:
        read_server_log(text, source="mixed.log", release=server_release("0.5.8"))
    assert "lines 1 and 2" in str(e.value)


def test_a_line_the_declared_release_cannot_print_is_an_error():
    text = PREFIX + msg_0_5_6(8, 10, 0.01, 1.68, 0.84, 56.8, 0)
    with pytest.raises(DiagError, match="not written by the declared SGLang release") as e:
        read_server_log(text, source="old.log", release=LAST_COVERED)
    assert "0.5.6 - 0.5.8" in str(e.value)


def test_truncated_line_and_uncovered_release_are_errors():
    with pytest.raises(DiagError, match="lacks fields"):
        parse_decode_line(PREFIX + "Decode batch, #running-req: 8, #token: 10, accept len: 1.68, acc", 4, "f")
    with pytest.raises(DiagError, match="cannot read server output"):
        server_release("0.5.5")
    with pytest.raises(DiagError, match="not an SGLang release"):
        server_release("latest")


def test_two_launches_with_different_trees_are_an_error():
    text = "\n".join(["server_args=ServerArgs(speculative_num_steps=1, speculative_eagle_topk=1, "
                      "speculative_num_draft_tokens=2, max_running_requests=48)",
                      PREFIX + msg_0_5_11(8, 10, 0.01, 1.68, 0.68, 56.8, 0),
                      "server_args=ServerArgs(speculative_num_steps=3, speculative_eagle_topk=4, "
                      "speculative_num_draft_tokens=5, max_running_requests=48)",
                      PREFIX + msg_0_5_11(8, 10, 0.01, 2.2, 0.3, 82.3, 0)])
    with pytest.raises(DiagError, match="two server launches"):
        read_server_log(text, source="two.log", release=LAST_COVERED)


def test_plain_and_speculative_lines_mixed_are_an_error():
    text = "\n".join([PREFIX + msg_0_5_11(8, 10, 0.01, None, None, 90.0, 0),
                      PREFIX + msg_0_5_11(8, 10, 0.01, 2.2, 0.3, 82.3, 0)])
    with pytest.raises(DiagError, match="mixes plain and speculative"):
        read_server_log(text, source="both.log", release=LAST_COVERED)
    with pytest.raises(DiagError, match="from a speculative run"):
        read_baseline_log(text, source="both.log")
