"""PNG plots of a benchmark (matplotlib, Agg backend): speedup vs gamma with the Thm 3.8 curve,
acceptance per draft position, speedup per category per method."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["write_plots"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _short(name: str) -> str:
    """A draft's name for a legend: the last part of a path."""
    return Path(name).name if "/" in name else name


def _panels(plt, count: int):
    fig, axes = plt.subplots(1, max(count, 1), figsize=(5.5 * max(count, 1), 4.2), squeeze=False)
    return fig, list(axes[0])


def _speedup_vs_gamma(plt, results: Mapping, path: Path) -> None:
    summary, temperatures = results["summary"], results["config"]["temperatures"]
    rows = [r for r in summary["rows"] if r["scope"] == "sweep" and r["family"] == "specdecode"]
    fig, axes = _panels(plt, len(temperatures))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, t in zip(axes, temperatures):
        drafters = list(dict.fromkeys(r["drafter"] for r in rows if r["temperature"] == t))
        for n, drafter in enumerate(drafters):
            color = colors[n % len(colors)]
            mine = sorted((r for r in rows if r["drafter"] == drafter and r["temperature"] == t), key=lambda r: r["gamma"])
            mine = [r for r in mine if r["speedup"]["median"] is not None]
            if not mine:
                continue
            gammas = [r["gamma"] for r in mine]
            med = [r["speedup"]["median"] for r in mine]
            low = [m - r["speedup"]["q1"] for m, r in zip(med, mine)]
            high = [r["speedup"]["q3"] - m for m, r in zip(med, mine)]
            ax.errorbar(gammas, med, yerr=[low, high], fmt="o-", color=color, capsize=3, label=f"{_short(drafter)} measured")
            best = next((b for b in summary["best_gamma"] if b["drafter"] == drafter and b["temperature"] == t), None)
            if best and best["curve"]:
                curve = sorted((int(g), v) for g, v in best["curve"].items())
                ax.plot([g for g, _ in curve], [v for _, v in curve], "--", color=color, alpha=0.7,
                        label=f"{_short(drafter)} Thm 3.8 (α={best['alpha']:.2f}, c={best['c']:.2f})")
            if best and best["measured"] in gammas:
                ax.plot([best["measured"]], [med[gammas.index(best["measured"])]], "*", color=color, markersize=14)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(sorted({r["gamma"] for r in rows} | {1}))
        ax.set_xlabel("γ (draft tokens per target call)")
        ax.set_ylabel("speedup over the target alone")
        ax.set_title(f"T = {t:g} (★ measured optimum)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _acceptance_per_position(plt, results: Mapping, path: Path) -> None:
    cfg = results["config"]
    gamma = max(cfg["gammas"])
    rows = [r for r in results["summary"]["rows"] if r["scope"] == "overall" and r["family"] == "specdecode"
            and r["gamma"] == gamma and r["acceptance"]]
    fig, axes = _panels(plt, len(cfg["temperatures"]))
    for ax, t in zip(axes, cfg["temperatures"]):
        for r in [r for r in rows if r["temperature"] == t]:
            rates = r["acceptance"]["per_position"]
            points = [(i + 1, x) for i, x in enumerate(rates) if x is not None]
            if points:
                ax.plot([p for p, _ in points], [x for _, x in points], "o-", label=_short(r["drafter"]))
        ax.set_xticks(range(1, gamma + 1))
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate at the position")
        ax.set_title(f"T = {t:g}, γ = {gamma}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _speedup_per_category(plt, results: Mapping, path: Path) -> None:
    cfg = results["config"]
    rows = [r for r in results["summary"]["rows"] if r["scope"] == "category" and r["family"] == "specdecode"
            and r["gamma"] == cfg["gamma"] and r["drafter"] in cfg["category_drafts"]]
    categories = list(dict.fromkeys(p["category"] for p in results["prompts"]))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = _panels(plt, len(cfg["temperatures"]))
    width = 0.8 / max(len(methods), 1)
    for ax, t in zip(axes, cfg["temperatures"]):
        by = {(r["method"], r["category"]): r["speedup"]["median"] for r in rows if r["temperature"] == t}
        for n, method in enumerate(methods):
            xs = [i + (n - (len(methods) - 1) / 2) * width for i in range(len(categories))]
            ax.bar(xs, [by.get((method, c)) or 0.0 for c in categories], width, label=_short(method))
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels(categories, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("speedup over the target alone")
        ax.set_title(f"T = {t:g}, γ = {cfg['gamma']}")
        if methods:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(results: Mapping, out: Path) -> dict[str, str]:
    """Write the three PNGs into out; return {name: file name}."""
    plt = _pyplot()
    files = {
        "speedup vs gamma": ("speedup_vs_gamma.png", _speedup_vs_gamma),
        "acceptance per draft position": ("acceptance_per_position.png", _acceptance_per_position),
        "speedup per category": ("speedup_per_category.png", _speedup_per_category),
    }
    for name, (filename, draw) in files.items():
        draw(plt, results, Path(out) / filename)
    return {name: filename for name, (filename, _) in files.items()}
