"""scripts/plot_bench.py draws argus-bench's e2e and attention reports as SVG: one line per KV
type, ARGUS beside llama.cpp, at the report's own coordinates."""
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "plot_bench.py"


def draw(tmp_path, report):
    source = tmp_path / "report.json"
    source.write_text(json.dumps(report))
    out = tmp_path / "report.svg"
    result = subprocess.run([sys.executable, str(SCRIPT), str(source), "-o", str(out)],
                            capture_output=True, text=True)
    return result, out


def texts(svg_path):
    """The strings of the SVG: matplotlib writes each label as a comment before its glyphs."""
    text = svg_path.read_text()
    ElementTree.fromstring(text)  # well-formed
    return set(re.findall(r"<!-- (.*?) -->", text))


def e2e_point(depth, kv, ms, peer_ms):
    return {"depth": depth, "kv": kv, "ms_per_token": ms, "tokens_per_s": 1000 / ms,
            "roofline_ms": ms / 2, "peer_ms_per_token": peer_ms}


def test_e2e_report_draws_argus_and_llama_cpp_per_kv_type(tmp_path):
    report = {"bench": "e2e", "model": "tiny", "weight_type": "q8_0", "threads": 2,
              "read_gbps": 20.0,
              "points": [e2e_point(0, "f16/f16", 40, 38), e2e_point(4096, "f16/f16", 50, 75),
                         e2e_point(0, "q4_0/q4_0", 41, 48), e2e_point(4096, "q4_0/q4_0", 45, 140)]}
    result, out = draw(tmp_path, report)
    assert result.returncode == 0, result.stderr
    labels = texts(out)
    for kv in ("f16/f16", "q4_0/q4_0"):
        assert f"ARGUS {kv}" in labels
        assert f"llama.cpp {kv}" in labels
        assert f"roofline {kv}" in labels
    assert "decode tokens / s" in labels
    assert "4096" in labels  # a depth tick


def test_attention_report_draws_one_panel_per_model(tmp_path):
    results = [{"model": model, "pair": pair, "context": context, "model_layers": 24,
                "ms_per_token_model": context / 1000 * scale,
                "roofline_ms_model": context / 4000 * scale}
               for model in ("llama-3-8b", "qwen2.5-0.5b")
               for pair, scale in (("f16/f16", 1.0), ("q4_0/q4_0", 0.5))
               for context in (4096, 16384)]
    report = {"config": {"threads": 2}, "machine": {"kernel_path": "avx2"}, "results": results}
    result, out = draw(tmp_path, report)
    assert result.returncode == 0, result.stderr
    labels = texts(out)
    assert {"f16/f16", "q4_0/q4_0", "16384"} <= labels
    assert any(label.startswith("llama-3-8b") for label in labels)
    assert any(label.startswith("qwen2.5-0.5b") for label in labels)


def frontier_point(ladder, fraction, share, disk_bytes, time_ratio, error):
    config = {"model": "llama-3-8b", "layers": 4, "tokens": 262144, "disk_time_share": share}
    long_run = {"disk_bytes_per_token": disk_bytes, "mean_rel_error": error,
                "effective_bits_per_value": 32 * fraction}
    bound = [{"bits_per_value": b, "uniform_rel_error": 0.6 * 2 ** -b,
              "by_attention_rel_error": 0.04 * 2 ** -b} for b in range(1, 9)]
    return {"ladder": ladder, "ram_fraction": fraction,
            "report": {"config": config, "long": long_run, "time_ratio": time_ratio,
                       "rate_distortion": bound}}


def test_capacity_frontier_draws_ladders_budgets_and_shares(tmp_path):
    points = [frontier_point("capacity", 0.25, 0.05, 0.0, 2.0, 0.3),
              frontier_point("capacity", 0.125, 0.333, 4e6, 3.5, 0.2),
              frontier_point("capacity-lowbit", 0.25, 0.75, 9e6, 5.0, 0.05)]
    report = {"bench": "capacity-frontier", "threads": 2, "points": points}
    result, out = draw(tmp_path, report)
    assert result.returncode == 0, result.stderr
    labels = texts(out)
    assert {"capacity", "capacity-lowbit", "25.0% RAM", "12.5% RAM"} <= labels
    assert {"0.05", "0.33", "0.75"} <= labels  # each point's disk time share
    assert "disk MB read / token" in labels
    assert "time / token over the all-in-RAM run" in labels
    assert {"bits per value in RAM", "bound, same rate every token",
            "bound, bits where attention falls"} <= labels


def test_another_report_is_refused_naming_it(tmp_path):
    result, _ = draw(tmp_path, {"bench": "store", "rows": []})
    assert result.returncode != 0
    assert "not an argus-bench e2e or attention report, nor a capacity frontier" in result.stderr
