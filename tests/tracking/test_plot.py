#!/usr/bin/python3
"""scripts/hyflow-plot on small synthetic metrics files: a GRPO-shaped and an SFT-shaped run give a
PNG (signature, size) and an SVG that parses as XML; bad input is an error naming file:line.
Usage: test_plot.py <hyflow-plot script>"""
import json
import math
import pathlib
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

script = sys.argv[1]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def run(*args):
    return subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True, timeout=120)


def grpo_rows(steps):
    yield {"step": 0, "timing_s/testing": 0.1, "val-core/arithmetic/reward/mean@1": 0.3}
    for s in range(1, steps + 1):
        row = {"step": s, "critic/score/mean": 0.2 + 0.6 * s / steps + 0.05 * math.sin(s), "actor/ppo_kl": 0.0,
               "actor/kl_loss": 0.01 / s, "actor/entropy": 1.0 - 0.8 * s / steps, "response_length/mean": 3.0,
               "perf/throughput": 2000.0 + 10 * s, "actor/lr": 5e-4, "timing_s/gen": 0.02, "timing_s/update_actor": 0.3,
               "timing_s/step": 0.35, "training/epoch": 0}
        if s % 50 == 0:
            row.update({"val-core/arithmetic/reward/mean@1": 0.3 + 0.5 * s / steps, "timing_s/testing": 0.1})
        yield row


def sft_rows(steps):
    for s in range(1, steps + 1):
        row = {"step": s, "train/loss": 2.0 / s, "train/lr": 1e-4 * min(1.0, s / 10), "train/grad_norm": 1.0}
        if s % 20 == 0:
            row["val/loss"] = 2.5 / s
        yield row


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def png_size(data):
    """(width, height) from the IHDR chunk of a PNG."""
    return struct.unpack(">II", data[16:24])


def check_plot(metrics, stem, expect_in_summary, expect_omitted):
    out = run(metrics, "-o", stem.with_suffix(".png"), "--title", "synthetic")
    check(out.returncode == 0, f"{metrics.name}: exit {out.returncode}: {out.stderr}")
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    data = png.read_bytes() if png.exists() else b""
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{png}: no PNG signature")
    check(len(data) > 10_000, f"{png}: only {len(data)} bytes")
    if len(data) >= 24:
        width, height = png_size(data)
        check(width >= 600 and height >= 300, f"{png}: {width}x{height} pixels")
    try:
        root = ET.parse(svg).getroot()
        check(root.tag.endswith("svg"), f"{svg}: root element {root.tag}")
        check(sum(1 for e in root.iter() if e.tag.endswith("path")) > 10, f"{svg}: hardly any paths")
    except (ET.ParseError, OSError) as e:
        check(False, f"{svg}: not XML: {e}")
    for text in expect_in_summary:
        check(text in out.stdout, f"{metrics.name}: summary lacks {text!r}: {out.stdout!r}")
    check(expect_omitted in out.stderr, f"{metrics.name}: stderr lacks {expect_omitted!r}: {out.stderr!r}")


def check_error(metrics, content, expected):
    metrics.write_text(content)
    out = run(metrics, "-o", metrics.with_suffix(""))
    check(out.returncode == 2, f"{metrics.name}: exit {out.returncode}, expected 2")
    check(expected in out.stderr, f"{metrics.name}: stderr {out.stderr!r} lacks {expected!r}")
    check("Traceback" not in out.stderr, f"{metrics.name}: a traceback instead of a message: {out.stderr}")
    check(not metrics.with_suffix(".png").exists(), f"{metrics.name}: a PNG written for bad input")


with tempfile.TemporaryDirectory(prefix="hyflow_plot_") as tmp:
    tmp = pathlib.Path(tmp)
    grpo = tmp / "metrics.jsonl"
    write(grpo, grpo_rows(200))
    check_plot(grpo, tmp / "out" / "grpo",
               ["steps 0-200", "val-core/arithmetic/reward/mean@1 0.300 (step 0) -> 0.800 (step 200)"],
               "no data for Loss: panels left out")
    sft = tmp / "sft_metrics.jsonl"
    write(sft, sft_rows(60))
    check_plot(sft, tmp / "sft", ["steps 1-60", "val/loss 0.125 (step 20) -> 0.042 (step 60)"],
               "no data for Reward, Validation, KL, Entropy, Response length, Throughput, Phase times")

    helped = run("--help")
    check(helped.returncode == 0 and "--title" in helped.stdout and "--output" in helped.stdout, "--help")

    blocked = subprocess.run(  # a python3 without matplotlib: a message, not a traceback
        [sys.executable, "-c", "import runpy, sys; sys.modules['matplotlib'] = None; "
         f"sys.argv = ['hyflow-plot', {str(grpo)!r}, '-o', {str(tmp / 'blocked')!r}]; "
         f"runpy.run_path({script!r}, run_name='__main__')"], capture_output=True, text=True, timeout=60)
    check(blocked.returncode == 1 and "needs matplotlib" in blocked.stderr and "Traceback" not in blocked.stderr,
          f"without matplotlib: exit {blocked.returncode}: {blocked.stderr!r}")

    check_error(tmp / "bad_json.jsonl", '{"step": 1}\n\n{"step": 2,\n', "bad_json.jsonl:3: not JSON")
    check_error(tmp / "no_step.jsonl", '{"step": 1, "a": 1}\n{"a": 2}\n',
                'no_step.jsonl:2: not a metrics line: expected a JSON object with an integer "step"')
    check_error(tmp / "empty.jsonl", "\n", "empty.jsonl: no metrics lines")
    check_error(tmp / "unknown.jsonl", '{"step": 1, "my/metric": 2}\n', "no metrics of a known panel")

if failures:
    sys.exit("test_plot: " + str(len(failures)) + " failure(s):\n  " + "\n  ".join(failures))
print("test_plot: GRPO and SFT plots, --help, a python3 without matplotlib and 4 bad inputs checked")
