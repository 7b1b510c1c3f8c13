#!/usr/bin/env python3
"""Draws an `argus-bench e2e` or `attention` JSON report, or a capacity frontier, as an SVG.

    scripts/plot_bench.py docs/results/e2e-DATE.json -o docs/results/e2e-DATE.svg
    scripts/plot_bench.py docs/results/attention-DATE.json -o docs/results/attention-DATE.svg
    scripts/plot_bench.py docs/results/capacity-frontier-DATE.json -o docs/results/capacity-frontier-DATE.svg

e2e: decode tokens per second and ms per token against depth, one line per KV type, ARGUS solid
and llama.cpp (the peer measured in the same run) dashed in the same colour, the roofline dotted.
attention: whole-model ms per token against context, one panel per model geometry, one line per
K/V pair, the roofline of each pair dotted.
capacity frontier (scripts/capacity_frontier.py): mean attention error against disk bytes per
token, against time over the all-in-RAM run and against bits per value in RAM (beside the
rate-distortion bound's error, two ways of spending the bits), one colour per ladder, one marker per RAM budget, each
point labelled with its disk time share; the goals (10% error, 3x time) dashed.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

# matplotlib writes a date and random element ids into an SVG unless told otherwise; the figure
# is a function of the data.
SVG_METADATA = {"Date": None}
matplotlib.rcParams["svg.hashsalt"] = "argus"


def by_key(points, key):
    groups = {}
    for point in points:
        groups.setdefault(point[key], []).append(point)
    return {name: sorted(group, key=lambda p: p.get("depth", p.get("context", 0)))
            for name, group in groups.items()}


def machine_line(report):
    """Threads, kernel path and bandwidth probe, from whichever fields the report has."""
    machine, config = report.get("machine", {}), report.get("config", {})
    threads = report.get("threads", config.get("threads", "?"))
    parts = [f"{threads} threads"]
    if machine.get("kernel_path"):
        parts.append(f"{machine['kernel_path']} kernels")
    gbps = report.get("read_gbps", machine.get("read_gbps_all_threads"))
    if gbps:
        parts.append(f"bandwidth probe {gbps:.1f} GB/s")
    return ", ".join(parts)


def plot_e2e(report, out):
    lines = by_key(report["points"], "kv")
    fig, (rate, time) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, (kv, points) in enumerate(lines.items()):
        colour = f"C{index}"
        depth = [p["depth"] for p in points]
        rate.plot(depth, [p["tokens_per_s"] for p in points], "o-", color=colour,
                  label=f"ARGUS {kv}")
        time.plot(depth, [p["ms_per_token"] for p in points], "o-", color=colour,
                  label=f"ARGUS {kv}")
        time.plot(depth, [p["roofline_ms"] for p in points], ":", color=colour,
                  label=f"roofline {kv}")
        peer = [p for p in points if p.get("peer_ms_per_token")]
        if peer:
            rate.plot([p["depth"] for p in peer], [1000 / p["peer_ms_per_token"] for p in peer],
                      "s--", color=colour, label=f"llama.cpp {kv}")
            time.plot([p["depth"] for p in peer], [p["peer_ms_per_token"] for p in peer], "s--",
                      color=colour, label=f"llama.cpp {kv}")
    rate.set(xlabel="depth (tokens in the cache)", ylabel="decode tokens / s",
             title="decode rate")
    time.set(xlabel="depth (tokens in the cache)", ylabel="ms / token", title="time per token")
    depths = sorted({p["depth"] for p in report["points"]})
    for axis in (rate, time):
        axis.set_xticks(depths)  # the depths measured, not the axis's own round numbers
        axis.grid(alpha=0.3)
        axis.set_ylim(bottom=0)
    rate.legend(fontsize=8)
    time.legend(fontsize=7, ncol=2)
    fig.suptitle(f"argus-bench e2e: {report['model']} ({report.get('weight_type', '')}), "
                 f"{machine_line(report)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, metadata=SVG_METADATA)


def plot_attention(report, out):
    models = by_key(report["results"], "model")
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for axis, (model, results) in zip(axes[0], models.items()):
        for index, (pair, points) in enumerate(by_key(results, "pair").items()):
            colour = f"C{index}"
            context = [p["context"] for p in points]
            axis.plot(context, [p["ms_per_token_model"] for p in points], "o-", color=colour,
                      label=pair)
            axis.plot(context, [p["roofline_ms_model"] for p in points], ":", color=colour)
        axis.set(xscale="log", yscale="log", xlabel="context (tokens)",
                 ylabel="attention ms / token (whole model)",
                 title=f"{model} ({points[0]['model_layers']} layers); dotted: roofline")
        axis.set_xticks(sorted({p["context"] for p in results}))
        axis.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8)
    fig.suptitle(f"argus-bench attention, {machine_line(report)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, metadata=SVG_METADATA)


def plot_frontier(report, out):
    fig, (disk, time, bits) = plt.subplots(1, 3, figsize=(15, 4.2))
    ladders = list(dict.fromkeys(p["ladder"] for p in report["points"]))
    fractions = sorted({p["ram_fraction"] for p in report["points"]}, reverse=True)
    markers = "os^Dv"
    for point in report["points"]:
        run = point["report"]["long"]
        colour = f"C{ladders.index(point['ladder'])}"
        marker = markers[fractions.index(point["ram_fraction"]) % len(markers)]
        share = f"{point['report']['config']['disk_time_share']:.2g}"
        for axis, x in ((disk, run["disk_bytes_per_token"] / 1e6),
                        (time, point["report"]["time_ratio"]),
                        (bits, run["effective_bits_per_value"])):
            axis.plot(x, run["mean_rel_error"], marker, color=colour)
            axis.annotate(share, (x, run["mean_rel_error"]), fontsize=7,
                          textcoords="offset points", xytext=(4, 3))
    bound = next((p["report"]["rate_distortion"] for p in report["points"]
                  if "rate_distortion" in p["report"]), [])
    if bound:
        for key, style, label in (("uniform_rel_error", ":", "bound, same rate every token"),
                                  ("by_attention_rel_error", "-.",
                                   "bound, bits where attention falls")):
            bits.plot([b["bits_per_value"] for b in bound], [b[key] for b in bound], style,
                      color="black", label=label)
        bits.legend(fontsize=8)
    for index, ladder in enumerate(ladders):
        disk.plot([], [], "o", color=f"C{index}", label=ladder)
    for index, fraction in enumerate(fractions):
        disk.plot([], [], markers[index % len(markers)], color="grey",
                  label=f"{fraction:.1%} RAM")
    for axis in (disk, time, bits):
        axis.axhline(0.1, color="grey", linestyle="--", linewidth=0.8)
        axis.set(yscale="log", ylabel="mean attention error (relative L2)")
        axis.grid(alpha=0.3, which="both")
    time.axvline(3.0, color="grey", linestyle="--", linewidth=0.8)
    disk.set(xscale="log", xlabel="disk MB read / token")
    time.set(xscale="log", xlabel="time / token over the all-in-RAM run")
    bits.set(xlabel="bits per value in RAM")
    disk.legend(fontsize=8)
    first = report["points"][0]["report"]["config"]
    fig.suptitle(f"capacity frontier: {first['model']} geometry, {first['layers']} layers, "
                 f"{first['tokens']} tokens; labels: disk time share; {machine_line(report)}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, metadata=SVG_METADATA)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report", help="an argus-bench e2e or attention JSON report, or a "
                        "capacity frontier (scripts/capacity_frontier.py)")
    parser.add_argument("-o", "--output", required=True, help="the SVG to write")
    args = parser.parse_args()
    with open(args.report) as f:
        report = json.load(f)
    if report.get("bench") == "capacity-frontier":
        plot_frontier(report, args.output)
    elif report.get("bench") == "e2e" or "points" in report:
        plot_e2e(report, args.output)
    elif "results" in report and all("pair" in r for r in report["results"]):
        plot_attention(report, args.output)
    else:
        sys.exit(f"{args.report}: not an argus-bench e2e or attention report, nor a capacity "
                 "frontier")


if __name__ == "__main__":
    main()
