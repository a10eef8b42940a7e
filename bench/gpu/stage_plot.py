#!/usr/bin/env python3
"""Draws the prefill's GPU time by part (`entropyinfer bench --device cuda --stage-times`) as one SVG of
stacked bars: a group per prompt length, a bar per method, each bar's length its prefill time as a
share of full attention's at that length, so the bar's end reads as 1 / speed-up and its segments show
where the time that is left goes (matrix products in blues, attention and the estimate in reds, the
pointwise kernels in greys). Plain SVG, no plotting library: it runs wherever python3 does.

    python3 bench/gpu/stage_plot.py --methods methods.json --svg prefill_by_part.svg

--methods takes either the bench's own JSON or methods_report.py's merged one.
"""
import argparse
import json
from xml.sax.saxutils import escape

# Drawing order and colour of every part the engine reports (CudaTransformer's stage names).
PARTS = [
    ("qkv product", "#08519c"), ("o product", "#3182bd"), ("gate/up product", "#6baed6"),
    ("down product", "#9ecae1"), ("attention", "#cb181d"), ("estimate", "#fb6a4a"),
    ("norms", "#525252"), ("qkv pointwise", "#737373"), ("swiglu", "#969696"),
    ("cache writes", "#bdbdbd"), ("embedding", "#d9d9d9"), ("logits", "#f0f0f0"),
    ("compression", "#fdae6b"),
]


def rows_of(document):
    engine = document.get("engine", document)
    return [r for r in engine["results"] if r.get("prefill_stage_ms")], engine


def render(rows, engine):
    lengths = sorted({r["prompt_tokens"] for r in rows})
    full = {r["prompt_tokens"]: sum(r["prefill_stage_ms"].values()) for r in rows
            if r["method"] == "full"}
    left, bar_width, bar_height, gap, group_gap = 190, 560, 18, 6, 22
    y = 86
    body = []
    for length in lengths:
        group = [r for r in rows if r["prompt_tokens"] == length]
        reference = full.get(length) or max(sum(r["prefill_stage_ms"].values()) for r in group)
        body.append(f'<text x="10" y="{y - 6}" font-weight="bold">{length:,} tokens</text>')
        for r in group:
            total = sum(r["prefill_stage_ms"].values())
            x = left
            body.append(f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">{escape(r["method"])}</text>')
            for name, colour in PARTS:
                ms = r["prefill_stage_ms"].get(name, 0.0)
                width = bar_width * ms / reference
                if width <= 0:
                    continue
                body.append(f'<rect x="{x:.2f}" y="{y}" width="{width:.2f}" height="{bar_height}" '
                            f'fill="{colour}" stroke="white" stroke-width="0.3"><title>{escape(name)}: '
                            f'{ms:.0f} ms</title></rect>')
                x += width
            speedup = f", {reference / total:.2f}x full" if r["method"] != "full" else ""
            body.append(f'<text x="{x + 6:.2f}" y="{y + 13}">{total / 1e3:.2f} s{speedup}</text>')
            y += bar_height + gap
        y += group_gap
    legend_y = y + 4
    legend = []
    for index, (name, colour) in enumerate(PARTS):
        lx = 10 + (index % 5) * 170
        ly = legend_y + (index // 5) * 20
        legend.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour}" stroke="#888" '
                      f'stroke-width="0.5"/><text x="{lx + 18}" y="{ly + 11}">{escape(name)}</text>')
    height = legend_y + 20 * ((len(PARTS) + 4) // 5) + 10
    title = (f"Prefill GPU time by part, {escape(engine.get('model', ''))}, {escape(engine.get('device', ''))}, "
             f"{escape(engine.get('date', '')[:10])}")
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{title}</text>',
        '<text x="10" y="38" fill="#555">bar length: the prefill as a share of full attention\'s at the '
        'same length; the times are those of one extra prefill per row</text>',
        '<text x="10" y="54" fill="#555">with CUDA events around each part (a little over the untimed '
        'prefills the headline ratios come from)</text>',
        *body, *legend, "</svg>", ""])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", required=True)
    parser.add_argument("--svg", required=True)
    args = parser.parse_args()
    rows, engine = rows_of(json.load(open(args.methods)))
    if not rows:
        raise SystemExit(f"{args.methods}: no row has prefill_stage_ms (run the bench with --stage-times)")
    open(args.svg, "w").write(render(rows, engine))


if __name__ == "__main__":
    main()
