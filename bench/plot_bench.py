"""Plots of a `tandem bench` JSON report (tandem bench --plots=DIR runs this).

    python bench/plot_bench.py REPORT.json OUT_DIR

Writes into OUT_DIR:
  ttft_cdf.png, itl_cdf.png   per-request TTFT and mean inter-token latency,
                              one curve per target, configuration and load
                              (the runs of all pairs pooled), the SLO as a
                              vertical line
  goodput_vs_load.png         goodput and throughput against the offered load,
                              when the report holds several loads
  crossover.png               goodput and inter-token p99 against the output
                              length per configuration (--sweep_threshold)
"""
import collections
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(run):
    parts = [run["target"]]
    if run.get("config"):
        parts.append(run["config"])
    if run.get("output_tokens_override"):
        parts.append(f'{run["output_tokens_override"]} out')
    parts.append(f'{run["concurrency"]} clients' if run["concurrency"] else f'{run["rate"]:g} req/s')
    return ", ".join(parts)


def cdf(runs, key, slo_key, title, path):
    # One curve per target, configuration and load: the runs of a
    # comparison's pairs pooled.
    pooled = collections.OrderedDict()
    slos = set()
    for run in runs:
        pooled.setdefault(label(run), []).extend(run["total"][key])
        slos.add(run["total"][slo_key])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in pooled.items():
        values = sorted(values)
        if not values:
            continue
        ys = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, ys, where="post", label=f"{name} ({len(values)} requests)")
    for slo in slos:
        ax.axvline(slo, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(title + " (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f'{runs[0]["scenario"]}: {title} per request (dashed: SLO)')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def goodput_vs_load(runs, path):
    series = collections.defaultdict(list)
    for run in runs:
        load = run["concurrency"] or run["rate"]
        series[(run["target"], run.get("config", ""))].append(
            (load, run["total"]["goodput_per_s"], run["total"]["requests_per_s"]))
    if all(len({p[0] for p in points}) < 2 for points in series.values()):
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (target, config), points in series.items():
        points.sort()
        name = target + (f" ({config})" if config else "")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name + " goodput")
        ax.plot([p[0] for p in points], [p[2] for p in points], marker=".", linestyle=":",
                label=name + " completed")
    ax.set_xlabel("offered load (req/s, or clients)")
    ax.set_ylabel("requests/s")
    ax.set_title(f'{runs[0]["scenario"]}: goodput against offered load')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def crossover(runs, path):
    swept = [r for r in runs if r.get("output_tokens_override")]
    if not swept:
        return False
    by_config = collections.defaultdict(lambda: collections.defaultdict(list))
    for run in swept:
        fg = [c for c in run["classes"] if not c["background"]]
        by_config[run["config"]][run["output_tokens_override"]].append(
            (run["total"]["goodput_per_s"], run["total"]["itl_ms"]["p99"],
             fg[0]["output_tokens_per_s"] if fg else 0))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for config, points in by_config.items():
        lengths = sorted(points)

        top.plot(lengths, [statistics.median([p[0] for p in points[n]]) for n in lengths], marker="o",
                 label=config)
        bottom.plot(lengths, [statistics.median([p[1] for p in points[n]]) for n in lengths], marker="o",
                    label=config)
    top.set_ylabel("goodput (req/s)")
    bottom.set_ylabel("inter-token p99 (ms)")
    bottom.set_xlabel("output tokens (foreground)")
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    top.set_title("colocated vs disaggregated vs gated, under long-prompt arrivals")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    report_path, out_dir = sys.argv[1], sys.argv[2]
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    runs = report["runs"]
    written = []
    if runs:
        cdf(runs, "ttft_samples_ms", "slo_ttft_ms", "time to first token",
            os.path.join(out_dir, "ttft_cdf.png"))
        cdf(runs, "itl_samples_ms", "slo_itl_ms", "mean inter-token latency",
            os.path.join(out_dir, "itl_cdf.png"))
        written += ["ttft_cdf.png", "itl_cdf.png"]
        if goodput_vs_load(runs, os.path.join(out_dir, "goodput_vs_load.png")):
            written.append("goodput_vs_load.png")
        if crossover(runs, os.path.join(out_dir, "crossover.png")):
            written.append("crossover.png")
    print("plots: " + ", ".join(os.path.join(out_dir, w) for w in written), file=sys.stderr)


if __name__ == "__main__":
    main()
