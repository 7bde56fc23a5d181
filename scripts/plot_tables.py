#!/usr/bin/env python3
"""Draws the docs' plots from the measured tables kept as data files.

    python3 scripts/plot_tables.py            # rewrites docs/img/*.svg

* docs/data/speed-per-k.csv -> docs/img/speed-per-k.svg: decode speed
  against llama.cpp (same process, same run) at k tokens per macro step
  (docs/performance.md).
* docs/data/heldout-confidence.csv -> docs/img/heldout-confidence.svg: the
  trained model's tokens per macro step against the loss of its base's
  log-likelihood, one point per confidence, one line per training run
  (docs/training.md).

Plain Python (no plotting library), so it runs wherever python3 does; the
output depends only on the CSV files, so a table changed by a new
measurement is one edit of its CSV and one run of this script.
"""

import csv
import os
from html import escape

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "docs", "data")
IMG = os.path.join(ROOT, "docs", "img")
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
FONT = 'font-family="sans-serif"'
SMALL, NORMAL, TITLE = 'font-size="10"', 'font-size="12"', 'font-size="14" font-weight="bold"'


def read_rows(name):
    """The CSV's rows as dicts; lines starting with # describe the table."""
    with open(os.path.join(DATA, name), newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def group(rows, key):
    """Rows grouped by `key`, groups in order of first appearance."""
    groups = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return groups


class Plot:
    """A line chart with linear axes, written as SVG."""

    def __init__(self, title, xlabel, ylabel, xrange, yrange, xticks, yticks, width=640, height=400):
        self.w, self.h = width, height
        self.left, self.right, self.top, self.bottom = 60, 190, 40, 50
        self.xr, self.yr = xrange, yrange
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="{width / 2 - self.right / 2 + self.left / 2:.1f}" y="22" text-anchor="middle" '
            f'{FONT} {TITLE}>{escape(title)}</text>',
        ]
        x0, x1, y0, y1 = self.left, width - self.right, height - self.bottom, self.top
        for t in xticks:
            x = self.x(t)
            self.parts.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" stroke="#e5e5e5"/>')
            self.parts.append(f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle" {FONT} {NORMAL}>{t:g}</text>')
        for t in yticks:
            y = self.y(t)
            self.parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e5e5e5"/>')
            self.parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" {FONT} {NORMAL}>{t:g}</text>')
        self.parts.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" stroke="#444"/>')
        self.parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{height - 12}" text-anchor="middle" {FONT} {NORMAL}>{escape(xlabel)}</text>')
        self.parts.append(
            f'<text x="16" y="{(y0 + y1) / 2:.1f}" text-anchor="middle" {FONT} {NORMAL} '
            f'transform="rotate(-90 16 {(y0 + y1) / 2:.1f})">{escape(ylabel)}</text>'
        )
        self.legend_y = y1 + 10

    def x(self, v):
        lo, hi = self.xr
        return self.left + (v - lo) / (hi - lo) * (self.w - self.left - self.right)

    def y(self, v):
        lo, hi = self.yr
        return self.h - self.bottom - (v - lo) / (hi - lo) * (self.h - self.top - self.bottom)

    def line(self, points, colour, label, labels=None, dashed=False):
        """A polyline with a marker per point, an optional text beside each point, and a legend entry."""
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        coords = " ".join(f"{self.x(px):.1f},{self.y(py):.1f}" for px, py in points)
        self.parts.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for i, (px, py) in enumerate(points):
            if not dashed:
                self.parts.append(f'<circle cx="{self.x(px):.1f}" cy="{self.y(py):.1f}" r="3.5" fill="{colour}"/>')
            if labels and labels[i]:
                self.parts.append(
                    f'<text x="{self.x(px) + 7:.1f}" y="{self.y(py) + 12:.1f}" {FONT} {SMALL} '
                    f'fill="{colour}">{escape(labels[i])}</text>'
                )
        lx = self.w - self.right + 14
        self.parts.append(
            f'<line x1="{lx}" y1="{self.legend_y}" x2="{lx + 22}" y2="{self.legend_y}" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        self.parts.append(f'<text x="{lx + 28}" y="{self.legend_y + 4}" {FONT} {NORMAL}>{escape(label)}</text>')
        self.legend_y += 20

    def marker(self, px, py, colour, label):
        """A single point (a goal) with its label."""
        x, y = self.x(px), self.y(py)
        self.parts.append(f'<path d="M{x - 6:.1f},{y:.1f} L{x:.1f},{y - 6:.1f} L{x + 6:.1f},{y:.1f} L{x:.1f},{y + 6:.1f} Z" fill="{colour}"/>')
        self.parts.append(f'<text x="{x - 8:.1f}" y="{y - 8:.1f}" text-anchor="end" {FONT} {NORMAL} fill="{colour}">{escape(label)}</text>')

    def save(self, name):
        os.makedirs(IMG, exist_ok=True)
        path = os.path.join(IMG, name)
        with open(path, "w") as f:
            f.write("\n".join(self.parts + ["</svg>"]) + "\n")
        print(path)


def speed_per_k():
    rows = read_rows("speed-per-k.csv")
    plot = Plot(
        "Decode speed against llama.cpp (2 CPU threads)",
        "tokens per macro step (k, forced)",
        "tokens/s relative to llama.cpp",
        (0.8, 4.2), (0.8, 2.4), [1, 2, 3, 4], [0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4],
    )
    plot.line([(0.8, 1.0), (4.2, 1.0)], "#888", "llama.cpp", dashed=True)
    for colour, (model, points) in zip(COLOURS, group(rows, "model").items()):
        plot.line([(float(r["k"]), float(r["ratio"])) for r in points], colour, model)
    plot.save("speed-per-k.svg")


def heldout_confidence():
    rows = read_rows("heldout-confidence.csv")
    plot = Plot(
        "Trained SmolLM2-HAMburger, 94 held-out prompts",
        "tokens per macro step",
        "loss of the base's log-likelihood (%)",
        (0.98, 1.65), (0, 145), [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], [0, 20, 40, 60, 80, 100, 120, 140],
    )
    for colour, (run, points) in zip(COLOURS, group(rows, "run").items()):
        points = sorted(points, key=lambda r: float(r["tokens_per_step"]))
        plot.line(
            [(float(r["tokens_per_step"]), float(r["ll_loss_percent"])) for r in points],
            colour, run,
            # the shipped run's points named by their confidence (below 1.05 tokens per step they crowd)
            labels=[f"confidence {r['confidence']}" if float(r["tokens_per_step"]) > 1.05 else None for r in points]
            if run.endswith("(ships)") else None,
        )
    plot.marker(1.6, 5, "#000", "goal: 1.6 within 5%")
    plot.save("heldout-confidence.svg")


if __name__ == "__main__":
    speed_per_k()
    heldout_confidence()
