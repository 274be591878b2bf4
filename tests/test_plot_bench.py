"""scripts/plot_bench.py: the paper's benchmark figures from bench_moe.py's JSON or a flat list
of records, and one line for every input or output it cannot use (issue 7)."""
import json

import pytest

from scripts import plot_bench


def test_benchmark_figures_of_a_bad_file(tmp_path):
    path = tmp_path / "bench.json"
    bad = {"missing": "No such file", "{": "is not JSON",  # a line, not a traceback
           json.dumps({"sweeps": {"n_experts": [{"d_model": 8}]}}): "KeyError 'results'",
           json.dumps([{"sweep": "s", "x": "big", "variant": "v", "ms": 1, "peak_mb": 1}]):
           "ValueError could not convert"}
    for text, why in bad.items():
        if text != "missing":
            path.write_text(text)
        with pytest.raises(SystemExit) as e:
            plot_bench.main([str(path), "--out", str(tmp_path / "fig")])
        assert e.value.code.startswith(f"error: {path}") and why in e.value.code
        assert "\n" not in e.value.code


def test_benchmark_figures(tmp_path):
    """Both inputs: the flat record list and scripts/bench_moe.py's own JSON."""
    records = [{"sweep": sweep, "x": x, "variant": v, "ms": x * (1 if v == "dense" else 0.3),
                "peak_mb": 2.0 * x, "note": "ignored"}
               for sweep, xs in (("d_model", (1024, 256, 512)), ("n_experts", (8, 16)),
                                 ("expert_size", (64, 128)))
               for v in ("dense", "moe") for x in xs]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"meta": {"device": "test"}, "results": records}))
    files = plot_bench.main([str(path), "--out", str(tmp_path / "fig")])
    assert sorted(p.name for p in files) == sorted(
        f"bench_{s}.{ext}" for s in ("d_model", "n_experts", "expert_size")
        for ext in ("png", "pdf"))
    assert all(p.stat().st_size > 1000 for p in files)
    x, ms, mb, graph_ms = plot_bench.series(records)["d_model"]["dense"]
    assert x == [256, 512, 1024] and ms == [256, 512, 1024] and mb == [512, 1024, 2048]
    assert all(g != g for g in graph_ms)  # NaN: no CUDA-graph times in these records

    def case(d, e, g, peak):
        return {"d_model": d, "n_experts": e, "expert_size": g, "d_ff": e * g, "tokens": 64,
                "k": 4, "results": {v: {"ms": d / 100 + i, "peak_mb": peak,
                                        "saved_mb": float(e * g)}
                                    for i, v in enumerate(("dense", "torch"))}}

    native = {"device": "cpu", "dtype": "torch.float32", "sweeps": {
        "dmodel_g128": [case(512, 16, 128, None), case(256, 8, 128, None)],
        "n_experts": [case(512, e, 128, None) for e in (8, 16)]}}
    meta, recs = plot_bench.records_of(native)
    got = plot_bench.series(recs)
    assert got["dmodel_g128"]["torch"][:3] == ([256, 512], [3.56, 6.12], [1024, 2048])
    assert got["n_experts"]["dense"][0] == [8, 16] and meta["device"] == "cpu"
    # captions give the measured shapes (the CPU sweeps are not the paper's sizes)
    assert plot_bench.caption("n_experts", recs) == "Fig. benchmark: d_model=512, G=128, d_ff=G N_E"
    assert (plot_bench.caption("dmodel_g128", recs)
            == "Fig. benchmark_es128: G=128, d_ff=4 d_model, N_E=d_ff/G")
    path.write_text(json.dumps(native))
    files = plot_bench.main([str(path)])
    assert sorted(p.name for p in files) == ["bench_dmodel_g128.pdf", "bench_dmodel_g128.png",
                                              "bench_n_experts.pdf", "bench_n_experts.png"]
    path.write_text(json.dumps({"results": [{"sweep": "d_model", "x": 1}]}))
    with pytest.raises(SystemExit, match="lacks"):
        plot_bench.main([str(path)])


@pytest.mark.parametrize("text", ["[]", '{"sweeps": {}}', '{"results": []}',
                                  '{"sweeps": {"n_experts": []}}'])
def test_benchmark_figures_of_no_results(text, tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:  # not "wrote 0 files" and exit 0
        plot_bench.main([str(path), "--out", str(tmp_path / "fig")])
    assert e.value.code == (f"error: {path} holds no benchmark results; give the JSON that "
                            "scripts/bench_moe.py wrote after its sweeps ran")
    assert not (tmp_path / "fig").exists()


def test_benchmark_figures_that_cannot_be_written(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps([{"sweep": s, "x": 1, "variant": "v", "ms": 1, "peak_mb": 1}
                                for s in ("a", "b")]))
    fig = tmp_path / "fig"
    (fig / "bench_b.pdf").mkdir(parents=True)  # the last file cannot be written
    for out, where, why in ((path, path, "it is a file"),
                            (path / "fig", path / "fig", "Not a directory"),
                            (fig, fig / "bench_b.pdf", "Is a directory")):
        with pytest.raises(SystemExit) as e:
            plot_bench.main([str(path), "--out", str(out)])
        assert e.value.code == (f"error: cannot write to {where}: {why}; give --out a "
                                "directory that can be written to")
    # the figures written before it are removed again, not left beside a missing one
    assert [p.name for p in fig.iterdir()] == ["bench_b.pdf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "fig"]


# -- from mutation testing (round 4): what the figures show ------------------------------
def test_figure_axes_series_and_labels(tmp_path, monkeypatch):
    """Mutants: the dashed (memory) lines drawn from the times, the memory axis called
    "saved activations" for a GPU peak (and the reverse), the x axis labelled with the
    sweep's name instead of its variable."""
    figs, close = [], plot_bench.plt.close
    monkeypatch.setattr(plot_bench.plt, "close", figs.append)  # kept open to be read
    nan = [float("nan")] * 2
    variants = {"dense": ([256.0, 512.0], [1.0, 2.0], [10.0, 30.0], nan),
                "torch": ([256.0, 512.0], [0.5, 0.7], [5.0, 6.0], nan)}
    for mem in ("peak", "saved"):
        plot_bench.plot("dmodel_g128", variants, {}, tmp_path, [], mem)
    assert len(figs) == 2
    for fig, mem in zip(figs, ("peak memory", "saved activations")):
        ax_t, ax_m = fig.axes
        assert ax_t.get_xlabel() == "$d_{model}$"
        assert ax_t.get_ylabel() == "time (ms), full lines"
        assert ax_m.get_ylabel() == f"{mem} (MB), dashed lines"
        assert [list(line.get_ydata()) for line in ax_t.get_lines()] == [[1.0, 2.0], [0.5, 0.7]]
        assert [list(line.get_ydata()) for line in ax_m.get_lines()] == [[10.0, 30.0],
                                                                        [5.0, 6.0]]
        close(fig)


def test_gpu_records_plot_the_peak_memory():
    """Mutant: the saved-activation bytes taken on a GPU too (its peak_mb was ignored)."""
    case = {"d_model": 8, "n_experts": 4, "expert_size": 2, "d_ff": 8, "tokens": 16, "k": 1,
            "results": {"dense": {"ms": 1.0, "peak_mb": 12.5, "saved_mb": 3.0}}}
    _, (rec,) = plot_bench.records_of({"sweeps": {"n_experts": [case]}})
    assert (rec["peak_mb"], rec["mem_kind"]) == (12.5, "peak")


def test_cuda_graph_times_are_dotted_lines_of_the_variants_colour(tmp_path, monkeypatch):
    """bench_moe.py on a GPU also times CUDA-graph replays (the GPU time alone): drawn dotted
    in the variant's colour, for the layers that have them (the torch path has none)."""
    def case(d):
        return {"d_model": d, "n_experts": 4, "expert_size": 2, "d_ff": 8, "tokens": 16,
                "k": 1, "results": {
                    "dense": {"ms": 2.0, "graph_ms": 1.9, "peak_mb": 9.0, "saved_mb": 1.0},
                    "triton": {"ms": 3.0, "graph_ms": d / 1000, "peak_mb": 3.0,
                               "saved_mb": 1.0},
                    "torch": {"ms": 9.0, "peak_mb": 3.0, "saved_mb": 1.0}}}

    _, recs = plot_bench.records_of({"sweeps": {"dmodel_g128": [case(512), case(256)]}})
    variants = plot_bench.series(recs)["dmodel_g128"]
    assert variants["triton"][3] == [0.256, 0.512]
    figs, close = [], plot_bench.plt.close
    monkeypatch.setattr(plot_bench.plt, "close", figs.append)
    plot_bench.plot("dmodel_g128", variants, {}, tmp_path, [])
    ax_t = figs[0].axes[0]
    dotted = [line for line in ax_t.get_lines() if line.get_linestyle() == ":"]
    assert [list(line.get_ydata()) for line in dotted] == [[1.9, 1.9], [0.256, 0.512]]
    assert [line.get_color() for line in dotted] == ["C0", "C1"]
    assert ax_t.get_ylabel() == "time (ms), full lines; CUDA graph, dotted"
    close(figs[0])
