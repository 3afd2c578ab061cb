"""Workloads: synthetic mixes, output distributions, trace formats, shipped traces, shift scenarios."""

from __future__ import annotations

import numpy as np
import pytest

from ebctl.sim import workloads


@pytest.mark.parametrize(("name", "mu_l", "mu_o"), [("decode-heavy", 128, 1024), ("balanced", 512, 512),
                                                    ("prefill-heavy", 1024, 128)])
def test_synthetic_mixes_are_uniform_half_to_one_and_a_half(name, mu_l, mu_o):
    wl = workloads.load(name, 20_000, seed=0)
    for x, mu in ((wl.input_len, mu_l), (wl.output_len, mu_o)):
        assert x.min() == round(0.5 * mu) and x.max() == round(1.5 * mu)
        assert x.mean() == pytest.approx(mu, rel=0.01)
    assert not wl.open_loop and wl.phases == ()


def test_geometric_and_gamma_outputs_have_the_mean_and_shape():
    g = workloads.load("geometric:L=100,O=200", 40_000, seed=1).output_len
    assert g.min() >= 1 and g.mean() == pytest.approx(200, rel=0.03)
    assert g.std() == pytest.approx(np.sqrt(200 * 199), rel=0.05)  # geometric: var = (1-p)/p²
    a = workloads.load("gamma:a=0.5,L=100,O=200", 40_000, seed=1).output_len
    assert a.mean() == pytest.approx(200, rel=0.05)
    assert a.std() / a.mean() == pytest.approx(np.sqrt(1 / 0.5), rel=0.1)  # CV of Gamma(a) = 1/√a


def test_same_seed_same_requests():
    a, b = workloads.load("balanced", 100, seed=3), workloads.load("balanced", 100, seed=3)
    assert (a.input_len == b.input_len).all() and (a.output_len == b.output_len).all()
    assert (a.input_len != workloads.load("balanced", 100, seed=4).input_len).any()


@pytest.mark.parametrize(("name", "mean_in", "mean_out"), [("azure-conv", 1155, 211), ("azure-code", 2048, 28),
                                                           ("mooncake-conv", 12035, 343)])
def test_shipped_traces_load_with_their_shape(name, mean_in, mean_out):
    wl = workloads.load(name, 50_000, seed=0)  # more than the rows: drawn with replacement
    assert wl.input_len.mean() == pytest.approx(mean_in, rel=0.05)
    assert wl.output_len.mean() == pytest.approx(mean_out, rel=0.05)
    readme = workloads.trace_path(name).parent / "README.md"
    assert "CC-BY-4.0" in readme.read_text() and "Apache-2.0" in readme.read_text()


def test_open_loop_replays_timestamps_scaled():
    a = workloads.load("azure-conv", 500, open_loop=True)
    b = workloads.load("azure-conv", 500, open_loop=True, time_scale=0.5)
    assert a.open_loop and a.arrival_s[0] == 0 and (np.diff(a.arrival_s) >= 0).all()
    assert b.arrival_s[-1] == pytest.approx(0.5 * a.arrival_s[-1])
    assert (a.input_len == b.input_len).all()
    assert 60 < a.arrival_s[-1] < 200  # a few requests per second, as the trace has


def test_trace_csv_formats(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("timestamp_ms,input_tokens,output_tokens\n0,10,5\n1500,20,1\n500,30.0,7\n")
    wl = workloads.from_trace(p, 3, open_loop=True)
    assert wl.arrival_s.tolist() == [0.0, 0.5, 1.5]
    assert wl.input_len.tolist() == [10, 30, 20] and wl.output_len.tolist() == [5, 7, 1]
    q = tmp_path / "az.csv"
    q.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n")
    wl = workloads.from_trace(q, 2, open_loop=True)
    assert wl.arrival_s.tolist() == pytest.approx([0.0, 4.314579])
    s = tmp_path / "s.csv"
    s.write_text("input_tokens,output_tokens,timestamp_s\n5,6,2.5\n")
    assert workloads.load(str(s), 1, open_loop=True).arrival_s.tolist() == [0.0]


def test_bad_traces_and_names_are_refused(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        workloads.from_trace(p, 1)
    nots = tmp_path / "nots.csv"
    nots.write_text("input_tokens,output_tokens\n1,2\n")
    with pytest.raises(ValueError, match="timestamp"):
        workloads.from_trace(nots, 1, open_loop=True)
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.load("nope", 10)
    with pytest.raises(ValueError, match="missing O"):
        workloads.load("geometric:L=10", 10)
    with pytest.raises(ValueError, match="open loop"):
        workloads.load("balanced", 10, open_loop=True)


def test_distribution_shift_phases():
    wl = workloads.load("dist-shift", 3000, seed=0)
    thirds = [slice(0, 1000), slice(1000, 2000), slice(2000, 3000)]
    for sl, (mu_l, mu_o) in zip(thirds, workloads.DIST_SHIFT, strict=True):
        assert wl.input_len[sl].mean() == pytest.approx(mu_l, rel=0.05)
        assert wl.output_len[sl].mean() == pytest.approx(mu_o, rel=0.05)


def test_concurrency_shift_phases():
    wl = workloads.load("conc-shift", 1000, seed=0)
    assert [wl.concurrency_at(i, 7) for i in (0, 199, 200, 400, 600, 999)] == [32, 32, 512, 1024, 256, 2048]
    assert workloads.load("balanced", 10).concurrency_at(5, 7) == 7


@pytest.mark.parametrize(("body", "message"), [
    ("1,5,-3\n", "line 2: output_tokens='-3': a request needs at least 1 token"),
    ("1,5,3\n2,0,4\n", "line 3: input_tokens='0': a request needs at least 1 token"),
    ("1,5,3\n\n2,abc,4\n", "line 4: input_tokens='abc' is not a number"),
    ("1,5,2.5\n", "line 2: output_tokens='2.5' is not a whole number of tokens"),
    ("x,5,3\n", "line 2: timestamp_s='x' is not a number"),
    ("1,5\n", "line 2: 2 cells, the header has 3"),
])
def test_bad_trace_cells_name_the_file_line_column_and_value(tmp_path, body, message):
    p = tmp_path / "t.csv"
    p.write_text("timestamp_s,input_tokens,output_tokens\n" + body)
    with pytest.raises(ValueError) as e:
        workloads.from_trace(p, 1)
    assert str(e.value) == f"{p}, {message}"


def test_bad_header_names_the_file_once(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError) as e:
        workloads.from_trace(p, 1)
    assert str(e.value).count(str(p)) == 1 and "header ['a', 'b']" in str(e.value)


@pytest.mark.parametrize(("name", "row"), [("sharegpt-like", "ShareGPT"), ("longbench-like", "LongBench"),
                                           ("numinamath-like", "NuminaMath")])
def test_paper_workloads_have_table_9s_statistics(name, row):
    # Table 9 of the paper (range, mean; outputs also σ), as ebctl/data/paper_measurements.json copies it
    table9 = {"ShareGPT": ((1, 20448), 105, (2, 500), 280, 153), "LongBench": ((1000, 4000), 2492, (1, 19), 11, 4),
              "NuminaMath": ((16, 1395), 122, (800, 3149), 1039, 228)}
    (ilo, ihi), imean, (olo, ohi), omean, osd = table9[row]
    wl = workloads.load(name, 40_000, seed=0)
    assert ilo <= wl.input_len.min() and wl.input_len.max() <= ihi
    assert olo <= wl.output_len.min() and wl.output_len.max() <= ohi
    assert wl.input_len.mean() == pytest.approx(imean, rel=0.03)
    assert wl.output_len.mean() == pytest.approx(omean, rel=0.02)
    assert wl.output_len.std() == pytest.approx(osd, rel=0.03)
