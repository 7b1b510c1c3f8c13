#!/usr/bin/env python3
"""Perplexity of a GGUF model with each KV codec pair and placement profile, beside llama.cpp.

Runs `argus eval` for every K/V codec pair and for the placement profiles at fractions of the
exact cache's RAM, and stock llama.cpp's `llama-perplexity` (../shared/peers) with the same
context and the KV types it also has, in one run on one machine. Writes every figure to a JSON
file and prints the tables of docs/eval.md.

    scripts/eval_table.py --json docs/results/eval-distill-DATE.json

Both tools score the same tokens: windows of --ctx tokens, BOS first, the second half scored.
"""
import argparse
import json
import os
import re
import tempfile
import time

from report_common import log, pinned_profile, run, write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

# (K, V) codec specs; the llama.cpp type where llama.cpp has the same pair (None: it has not).
PAIRS = [
    ("f16", "f16", "f16"),
    ("bf16", "bf16", "bf16"),
    ("q8_0", "q8_0", "q8_0"),
    ("int8", "int8", None),
    ("plane8", "plane8", None),
    ("fp8_e4m3", "fp8_e4m3", None),
    ("q4_0", "q4_0", "q4_0"),
    ("iq4_nl", "iq4_nl", "iq4_nl"),
    ("q4_0+rot+center", "q4_0", None),
    ("int4:channel", "int4", None),
    ("int4", "int4", None),
    ("plane8/4", "plane8/4", None),
    ("int4:channel", "int2", None),
    ("int2:channel", "int4", None),
    ("int2:channel", "int2", None),
    ("plane8/2", "plane8/2", None),
    ("nl3", "nl3", None),
    ("chan3", "nl3", None),
    ("chan2", "nl3", None),
    ("chan3", "nl2", None),
    ("chan2", "nl2", None),
]
PROFILES = ["exact", "balanced", "research", "capacity"]
FRACTIONS = [1.0, 0.75, 0.5, 0.25, 0.1]
# The codec rows keep the partly filled page in f32, so pages are quantised from the model's
# float values as llama.cpp quantises each token; the profile rows keep the default, f16.
CODEC_ACTIVE_TYPE = "f32"


def argus_eval(args, extra, scratch):
    out = os.path.join(scratch, "eval.json")
    run([args.argus, "eval", "-m", args.model, "-f", args.text, "-c", str(args.ctx),
         "--page-tokens", str(args.page_tokens), "-t", str(args.threads), "--json", out] + extra)
    with open(out) as f:
        return json.load(f)


def peer_perplexity(args, kv_type, base_logits):
    """llama.cpp's perplexity to six digits: its KL-divergence mode (against the f16 cache's
    logits, written by the first call) prints Mean PPL(Q) with six, its final estimate four."""
    def command(cache_type):
        return [args.peer, "-m", args.model, "-f", args.text, "-c", str(args.ctx), "-fa",
                "-t", str(args.threads), "-ctk", cache_type, "-ctv", cache_type,
                "--kl-divergence-base", base_logits]
    if not os.path.exists(base_logits):
        run(command("f16"), with_stderr=True)
    text = run(command(kv_type) + ["--kl-divergence"], with_stderr=True)
    match = re.search(r"Mean PPL\(Q\)\s*:\s*([0-9.]+) \S+\s+([0-9.]+)", text)
    if not match:
        raise SystemExit(f"llama-perplexity printed no Mean PPL(Q):\n{text[-2000:]}")
    return {"perplexity": float(match.group(1)), "stderr": float(match.group(2))}


def codec_rows(args, scratch, peer):
    rows = []
    for i, (k, v, peer_type) in enumerate(PAIRS):
        log(f"[{i + 1}/{len(PAIRS)}] codecs {k} / {v}")
        row = {"k": k, "v": v,
               "argus": argus_eval(args, ["--cache-type-k", k, "--cache-type-v", v,
                                          "--cache-type-active", CODEC_ACTIVE_TYPE], scratch)}
        if peer and peer_type:
            row["llama_cpp_type"] = peer_type
            row["llama_cpp"] = peer_perplexity(args, peer_type,
                                               os.path.join(scratch, "f16-logits.kld"))
        rows.append(row)
    return rows


def profile_rows(args, scratch, exact_bytes):
    rows = []
    disk = os.path.join(scratch, "disk")
    for p in PROFILES:
        profile = pinned_profile(p, scratch)
        for fraction in FRACTIONS:
            budget = int(exact_bytes * fraction)
            log(f"profile {p} at {fraction:.0%} of {exact_bytes} bytes")
            row = {"profile": p, "fraction": fraction, "ram_budget_bytes": budget}
            try:
                row["argus"] = argus_eval(args, ["--profile", profile, "--ram-budget", str(budget),
                                                 "--disk-dir", disk], scratch)
            except SystemExit as failure:  # a budget the profile cannot meet is a finding
                row["error"] = str(failure).strip().splitlines()[-1]
                log(f"  {row['error']}")
            rows.append(row)
    return rows


def markdown(report):
    exact = report["codecs"][0]["argus"]["perplexity"]
    peer_exact = report["codecs"][0].get("llama_cpp", {}).get("perplexity")
    lines = ["| K / V | bits per value | KV bytes | ARGUS | vs f16 | llama.cpp | vs f16 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    f16_bytes = report["codecs"][0]["argus"]["kv_page_bytes"]
    for row in report["codecs"]:
        a = row["argus"]
        bits = 16.0 * a["kv_page_bytes"] / f16_bytes
        peer = row.get("llama_cpp")
        peer_cells = (f"{peer['perplexity']:.6f} | {peer['perplexity'] / peer_exact - 1:+.2%}"
                      if peer else "— | —")
        lines.append(f"| {row['k']} / {row['v']} | {bits:.2f} | {a['kv_page_bytes']} | "
                     f"{a['perplexity']:.6f} | {a['perplexity'] / exact - 1:+.2%} | {peer_cells} |")
    lines += ["", "| profile | RAM budget | KV bytes in RAM | on disk | pages per state | "
              "perplexity | vs exact cache |", "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for row in report["profiles"]:
        if "error" in row:
            lines.append(f"| {row['profile']} | {row['fraction']:.0%} ({row['ram_budget_bytes']}) "
                         f"| — | — | — | {row['error']} | — |")
            continue
        a = row["argus"]
        states = "/".join(str(n) for n in a.get("placement", {}).get("pages_per_state", []))
        lines.append(f"| {row['profile']} | {row['fraction']:.0%} ({row['ram_budget_bytes']}) | "
                     f"{a['kv_ram_bytes']} | {a['kv_disk_bytes']} | {states or '—'} | "
                     f"{a['perplexity']:.5f} | {a['perplexity'] / exact - 1:+.2%} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--argus", default=os.path.join(ROOT, "build/release/argus"))
    parser.add_argument("--peer", default=os.path.join(SHARED, "peers/bin/llama-perplexity"),
                        help="llama.cpp's llama-perplexity (skipped, and said, when missing)")
    parser.add_argument("--model", default=os.path.join(SHARED, "models/stories-distill-3M.gguf"))
    parser.add_argument("--text",
                        default=os.path.join(SHARED, "models/stories-distill-heldout.txt"))
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--page-tokens", type=int, default=16,
                        help="small pages, so nearly all of each window is held in the codec")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-profiles", action="store_true", help="codec pairs only")
    parser.add_argument("--json", required=True, help="where the report goes")
    args = parser.parse_args()
    for path in (args.argus, args.model, args.text):
        if not os.path.exists(path):
            raise SystemExit(f"{path} does not exist")
    peer = os.access(args.peer, os.X_OK)
    if not peer:
        log(f"{args.peer} is missing: llama.cpp's column stays empty")
    started = time.time()
    info = json.loads(run([args.argus, "info", "--json"]))
    with tempfile.TemporaryDirectory(prefix="argus-eval-") as scratch:
        report = {"date": time.strftime("%Y-%m-%d"), "machine": info,
                  "model": os.path.basename(args.model), "text": os.path.basename(args.text),
                  "ctx": args.ctx, "page_tokens": args.page_tokens, "threads": args.threads,
                  "codec_active_type": CODEC_ACTIVE_TYPE}
        report["codecs"] = codec_rows(args, scratch, peer)
        exact_bytes = report["codecs"][0]["argus"]["kv_page_bytes"]
        report["profiles"] = [] if args.no_profiles else profile_rows(args, scratch, exact_bytes)
    report["seconds"] = time.time() - started
    write_report(report, args.json)
    print(markdown(report))


if __name__ == "__main__":
    main()
