"""report.md: the paper's Tables 2 and 3, the gamma sweep, a Spec-Bench per-category table, the peers."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

__all__ = ["draft_comparison_table", "render"]


def _f(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _speedup(s: Mapping | None, full: bool = True) -> str:
    """median [q1–q3] (min–max) of per-run speedups."""
    if not s or s.get("median") is None:
        return "–"
    text = f"{s['median']:.2f}×"
    if s["n"] > 1:
        text += f" [{s['q1']:.2f}–{s['q3']:.2f}]"
        if full:
            text += f" ({s['min']:.2f}–{s['max']:.2f})"
    return text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _t(temperature: float) -> str:
    return f"{temperature:g}"


def _packing(results: Mapping) -> str:
    """', linear layers `dual`' (the native target's packing, as chosen, with the timings 'auto' chose it on),
    or '' (HF, or an older results.json)."""
    packing = results.get("target_packing")
    if not packing:
        return ""
    layout = results.get("target_layout")
    if not layout:
        return f", linear layers `{packing}`"
    rows = layout["rows"]
    times = "; ".join(f"`{name}` {1000 * per_rows['1']:.1f} / {1000 * per_rows[str(rows)]:.1f}"
                      for name, per_rows in layout["seconds"].items())
    return (f", linear layers `{packing}` (packing `auto`: the fastest {rows}-token verification here; "
            f"ms for 1 / {rows} tokens: {times})")


def _accept(row: Mapping, key: str):
    return (row.get("acceptance") or {}).get(key)


_CHAT = {None: "chat template where the tokenizer has one", True: "chat template", False: "raw text"}


def _early_end(cfg: Mapping) -> str:
    """'; a draft model ends ...' where the run set min_confidence (older results have none)."""
    threshold = cfg.get("min_confidence")
    return (f"; a draft model ends its draft after a token its q gave less than {threshold:g} (the Thm 3.8 "
            "predictions assume γ draft tokens every call, so they are pessimistic for draft models; "
            "'from tokens/call' uses the measured draft length)") if threshold else ""


def _header(results: Mapping) -> list[str]:
    cfg, machine = results["config"], results["machine"]
    prompts = results["prompts"]
    categories = list(dict.fromkeys(p["category"] for p in prompts))
    sweep = [f"{p['category']} #{p['question_id']}" for p in prompts if p["in_sweep"]]
    state = "complete" if results.get("complete") else ("INTERRUPTED: partial results" if results.get("interrupted") else "in progress: partial results")
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v)
    drafts = ", ".join(f"`{d}`" + (f" ({results['drafters'][d]})" if d in results.get("drafters", {}) and results["drafters"][d] != d else "")
                       for d in cfg["drafts"])
    lines = [
        "# specdecode bench",
        "",
        f"`{results.get('command') or 'specdecode bench'}`",
        "",
        f"- run: {results.get('started', '?')}, {_f(results.get('wall_seconds'), '.0f', ' s')} wall time, {state}",
        f"- machine: {machine['processor']}, {machine['cpus']} CPUs, {machine['torch_threads']} torch threads, "
        f"{_f(machine.get('memory_gib'), '.0f', ' GiB')}; {machine['platform']}; Python {machine['python']}; {versions}",
        f"- target `{cfg['target']}` on backend `{cfg['backend']}`{_packing(results)}; drafts {drafts}{_early_end(cfg)}",
        f"- {len(prompts)} prompts from `{cfg['prompts']}` ({cfg['per_category']} per category: {', '.join(categories)}), "
        f"first turn, {_CHAT[cfg.get('chat')]}; "
        f"{cfg['max_new_tokens']} new tokens at most; temperatures {', '.join(_t(t) for t in cfg['temperatures'])}; seed {cfg['seed']}",
        f"- per-category table: {', '.join(cfg['category_drafts']) or 'no draft'} at γ = {cfg['gamma']} on every prompt; "
        f"gamma sweep γ ∈ {{{', '.join(map(str, cfg['gammas']))}}} for every draft and the HF peers on "
        f"{len(sweep)} prompt(s): {', '.join(sweep) or 'none'} (evenly spaced categories, prompts no longer than the median)",
    ]
    for skip in results.get("skipped") or []:
        lines.append(f"- skipped question {skip['question_id']} ({skip['category']}, {skip['prompt_tokens']} tokens): {skip['reason']}")
    if results.get("fit_corpus"):
        lines.append(f"- {results['fit_corpus']}")
    lines += [
        "- speedup: a run's tokens/s over the mean tokens/s of the same engine's plain decoding run just before and "
        "just after it (runs interleaved A B A C A ...); shown as median [IQR] (min–max) over runs; "
        "after the first token: the same ratio without the prefills, (tokens − 1) over the time after the first token",
        "- predicted: Thm 3.8 with measured costs, E(α, γ) / (γ c + T(γ+1)/T(1)), E = (1 − α^(γ+1)) / (1 − α); "
        "α pooled over the runs, c = T_draft(1)/T_target(1) from timed `extend` calls (or, for drafters without "
        "a model, their measured draft time per drafted position), T(k) the target's `extend` of k tokens; "
        "a drafter that often proposes nothing (prompt lookup without a match) pays only T(1) on those calls, "
        "so its prediction is pessimistic",
        "",
    ]
    return lines


def _exactness(results: Mapping) -> list[str]:
    rows = [r for r in results["summary"]["rows"] if r["scope"] == "overall"]
    greedy = sum(r["greedy_runs"] for r in rows if r["engine"] == "specdecode")
    mismatches = results.get("mismatches") or []
    ours = [m for m in mismatches if m["engine"] == "specdecode"]
    if not ours:
        lines = [f"**Greedy exactness: all {greedy} greedy speculative runs are token-identical to the target alone.**", ""]
    else:
        lines = [
            f"## ⚠ GREEDY OUTPUT MISMATCH: {len(ours)} of {greedy} greedy speculative runs differ from the target alone",
            "",
            "Speculative decoding must reproduce the target's greedy output token for token: this is a bug.",
            "",
        ]
        lines += _table(["method", "prompt", "category", "problem"],
                        [[m["method"], m["prompt"], m.get("category", ""), m["problem"]] for m in ours])
        lines.append("")
    theirs = [m for m in mismatches if m["engine"] != "specdecode"]
    if theirs:
        lines += [f"**⚠ {len(theirs)} greedy HF peer run(s) differ from plain HF generate:**", ""]
        lines += _table(["method", "prompt", "category", "problem"],
                        [[m["method"], m["prompt"], m.get("category", ""), m["problem"]] for m in theirs])
        lines.append("")
    return lines


def _table2(summary: Mapping) -> list[str]:
    sweep = {(r["drafter"], r["temperature"], r["gamma"]): r for r in summary["rows"]
             if r["scope"] == "sweep" and r["family"] == "specdecode"}
    rows = []
    for best in summary["best_gamma"]:
        if best["family"] != "specdecode":
            continue
        row = sweep.get((best["drafter"], best["temperature"], best["measured"]))
        if row is None:
            continue
        rows.append([f"`{best['drafter']}`", _t(best["temperature"]), best["measured"], _f(_accept(row, "alpha")),
                     _f(_accept(row, "tokens_per_call")), _speedup(row["speedup"], full=False),
                     _speedup(row.get("decode_speedup"), full=False), _f(row["predicted"], ".2f", "×"),
                     _f(row["measured_over_predicted"]), _f(best["predicted"], "d"), _f(best["ideal"], "d")])
    lines = ["## Speedup by draft and temperature (paper Table 2 style)", "",
             "At the measured best γ of the sweep. γ* Thm 3.8: the best γ predicted with measured costs; "
             "ideal: `optimal_gamma(α, c)`, the paper's formula with free verification.", ""]
    lines += _table(["draft", "T", "γ", "α", "tokens/call", "speedup", "after the first token", "predicted", "measured/predicted",
                     "γ* Thm 3.8", "γ* ideal"], rows)
    return lines + [""]


def _table3(summary: Mapping) -> list[str]:
    temperatures = list(dict.fromkeys(d["temperature"] for d in summary["drafters"]))
    by = {(d["drafter"], d["temperature"]): d for d in summary["drafters"]}
    rows = []
    for drafter in dict.fromkeys(d["drafter"] for d in summary["drafters"]):
        cells = [f"`{drafter}`"]
        for t in temperatures:
            d = by.get((drafter, t))
            cells.append("–" if d is None else f"{_f(d['acceptance']['alpha'])} ({d['runs']} runs)")
        rows.append(cells)
    lines = ["## Acceptance rate α by draft (paper Table 3 style)", "",
             "Empirical α = accepted / (accepted + rejected) draft tokens, pooled over every run of the draft (all γ).", ""]
    lines += _table(["draft", *[f"α at T = {_t(t)}" for t in temperatures]], rows)
    return lines + [""]


def _sweep(summary: Mapping) -> list[str]:
    best = {(b["drafter"], b["temperature"]): b for b in summary["best_gamma"]}
    rows = []
    sweep = [r for r in summary["rows"] if r["scope"] == "sweep" and r["family"] == "specdecode"]
    order = {d: i for i, d in enumerate(dict.fromkeys(r["drafter"] for r in sweep))}
    for r in sorted(sweep, key=lambda r: (r["temperature"], order[r["drafter"]], r["gamma"])):
        b = best.get((r["drafter"], r["temperature"]), {})
        marks = ("★" if b.get("measured") == r["gamma"] else "") + ("†" if b.get("predicted") == r["gamma"] else "")
        rows.append([f"`{r['drafter']}`", _t(r["temperature"]), r["gamma"], _f(_accept(r, "alpha")),
                     _f(_accept(r, "tokens_per_call")), _f(r["tokens_per_s"]["median"], ".1f"), _speedup(r["speedup"]),
                     _f(r["predicted"], ".2f", "×"), _f(r["predicted_ideal"], ".2f", "×"),
                     _f(r["predicted_from_tokens_per_call"], ".2f", "×"), _f(r["measured_over_predicted"]),
                     f"{_f(r['c'], '.3f')} ({r['c_source'] or '–'})", _f(r.get("c_run"), ".3f"), marks])
    lines = ["## Gamma sweep (sweep prompts)", "",
             "★ measured best γ, † best γ by Thm 3.8 with measured costs. predicted ideal: the paper's formula "
             "(free verification); from tokens/call: the measured tokens per target call over the measured cost of a call, "
             "the runs' draft seconds per call over T(1) plus T(k+1)/T(1) at the mean draft length k; "
             "c in the runs: the runs' draft seconds per call over γ, over T(1).", ""]
    lines += _table(["draft", "T", "γ", "α", "tokens/call", "tok/s", "speedup", "predicted", "predicted ideal",
                     "from tokens/call", "measured/predicted", "c", "c in the runs", ""], rows)
    return lines + [""]


def _categories(results: Mapping) -> list[str]:
    summary, cfg = results["summary"], results["config"]
    rows = [r for r in summary["rows"] if r["family"] == "specdecode" and r["gamma"] == cfg["gamma"]
            and r["drafter"] in cfg["category_drafts"] and r["scope"] in ("category", "overall")]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    categories = list(dict.fromkeys(p["category"] for p in results["prompts"]))
    lines = [f"## Spec-Bench per category (γ = {cfg['gamma']})", "",
             "Speedup: median over the category's prompts; τ: tokens per target call; baseline: specdecode's target "
             "alone, tokens/s.", ""]
    for t in cfg["temperatures"]:
        by = {(r["method"], r["category"] if r["scope"] == "category" else None): r for r in rows if r["temperature"] == t}
        table = []
        for category in [*categories, None]:
            first = next((by[(m, category)] for m in methods if (m, category) in by), None)
            if first is None:
                continue
            cells = ["**overall**" if category is None else category, first["prompts"],
                     _f(first["baseline_tokens_per_s"]["median"], ".1f")]
            for m in methods:
                r = by.get((m, category))
                cells += ["–"] * 3 if r is None else [_speedup(r["speedup"], full=category is None),
                                                      _speedup(r.get("decode_speedup"), full=False),
                                                      _f(_accept(r, "tokens_per_call"))]
            table.append(cells)
        lines += [f"### T = {_t(t)}", ""]
        lines += _table(["category", "prompts", "baseline tok/s",
                         *[c for m in methods for c in (m, "after the first token", "τ")]], table)
        lines.append("")
    return lines


def _peers(results: Mapping) -> list[str]:
    summary = results["summary"]
    rows = [r for r in summary["rows"] if r["engine"] == "hf" and r["scope"] == "overall"]
    base = [r for r in results["runs"] if r["role"] == "baseline" and r["engine"] == "hf"]
    lines = ["## Hugging Face generate peers (sweep prompts, same target weights)", "",
             "Speedup over plain `generate` of the same run, interleaved likewise. Assisted generation: constant "
             "γ draft tokens, no confidence cut-off; prompt lookup: up to 3-gram matches.", ""]
    if not rows and not base and not results.get("unavailable"):
        return lines + ["No peers were run.", ""]
    table = []
    for t in results["config"]["temperatures"]:
        at_t = [r for r in base if r["temperature"] == t]
        if at_t:
            rates = [r["tokens_per_s"] for r in at_t]
            table.append(["HF generate (plain)", _t(t), len({r["prompt"] for r in at_t}), f"{statistics.median(rates):.1f}",
                          "1 (baseline)", "–"])
        for r in [r for r in rows if r["temperature"] == t]:
            same = "–" if not r["greedy_runs"] else f"{r['identical']}/{r['greedy_runs']}"
            table.append([r["method"], _t(t), r["prompts"], _f(r["tokens_per_s"]["median"], ".1f"), _speedup(r["speedup"]), same])
    lines += _table(["method", "T", "prompts", "tok/s", "speedup", "greedy identical to HF plain"], table)
    ratio = summary.get("specdecode_over_hf_plain")
    if ratio and ratio.get("median"):
        lines += ["", f"specdecode's target alone runs at {ratio['median']:.2f}× the tokens/s of HF plain generate "
                      f"(median over {ratio['n']} prompt × temperature pairs)."]
    for u in results.get("unavailable") or []:
        lines.append(f"- **{u['method']}**: {u['reason']}")
    return lines + [""]


def _costs(results: Mapping) -> list[str]:
    costs = results.get("costs")
    if not costs:
        return []
    ratios = {int(k): v for k, v in costs["verify_ratio"].items()}
    medians = {int(k): v for k, v in costs["median_seconds"]["target"].items()}
    lines = ["## Measured costs", "",
             f"Medians of {costs['reps']} interleaved timings after a {costs['context_tokens']}-token context.", ""]
    lines += _table(["k", *map(str, sorted(ratios))],
                    [["T(k) ms", *[f"{medians[k] * 1000:.1f}" for k in sorted(ratios)]],
                     ["T(k)/T(1)", *[f"{ratios[k]:.2f}" for k in sorted(ratios)]]])
    if costs.get("c"):
        lines += ["", "Draft models: " + "; ".join(
            f"`{name}` T(1) = {costs['median_seconds'][name]['1'] * 1000:.1f} ms, c = {c:.3f}"
            for name, c in costs["c"].items())]
    return lines + [""]


def _positions(results: Mapping) -> list[str]:
    cfg = results["config"]
    rows = [r for r in results["summary"]["rows"] if r["scope"] == "overall" and r["family"] == "specdecode"
            and r["gamma"] == max(cfg["gammas"])]
    if not rows:
        return []
    width = max(len(_accept(r, "per_position") or []) for r in rows)
    table = [[f"`{r['drafter']}`", _t(r["temperature"]), *[_f(x) for x in (_accept(r, "per_position") or [])],
              *["–"] * (width - len(_accept(r, "per_position") or []))] for r in rows]
    lines = [f"## Acceptance per draft position (γ = {max(cfg['gammas'])})", "",
             "Of the draft tokens that reached position i (all before it accepted), the fraction accepted there.", ""]
    return lines + _table(["draft", "T", *[str(i + 1) for i in range(width)]], table) + [""]


def _noise(results: Mapping) -> list[str]:
    noise = results["summary"]["baseline_noise"]
    if not noise:
        return []
    lines = ["## Noise", "",
             "Run-to-run spread of plain decoding on one prompt: for each prompt and temperature, the largest "
             "|tokens/s ÷ median − 1| over its repeated baseline runs.", ""]
    rows = [[engine, s["n"], _f(s["median"], ".1%"), _f(s["q3"], ".1%"), _f(s["max"], ".1%")] for engine, s in noise.items()]
    return lines + _table(["engine", "prompt × T", "median", "75th pct", "max"], rows) + [""]


def _plots(results: Mapping) -> list[str]:
    plots = results.get("plots") or {}
    return ["## Plots", "", *[f"![{name}]({path})" for name, path in plots.items()], ""] if plots else []


def draft_comparison_table(runs: Sequence[Mapping]) -> str:
    """The category drafts of one or more bench runs side by side, a row per (temperature, draft): pooled α,
    tokens per call, the median speedup over all prompts, the mean of the per-category medians, and in how many
    categories each draft's median beats the first draft's, and at T=0 how many runs were token-identical to the
    target alone. Markdown, from the runs' results.json."""
    rows = []
    for results in runs:
        summary, cfg = results["summary"], results["config"]
        gamma, drafts = cfg["gamma"], cfg["category_drafts"]
        for t in cfg["temperatures"]:
            picked = [r for r in summary["rows"] if r["family"] == "specdecode" and r["gamma"] == gamma
                      and r["temperature"] == t and r["drafter"] in drafts]
            overall = {r["drafter"]: r for r in picked if r["scope"] == "overall"}
            medians = {d: {r["category"]: r["speedup"]["median"] for r in picked
                           if r["scope"] == "category" and r["drafter"] == d} for d in drafts}
            first = medians[drafts[0]]
            for d in drafts:
                row = overall[d]
                ahead = sum(medians[d][c] > first[c] for c in first if c in medians[d])
                rows.append([_t(t), f"`{d}`", gamma, _f(_accept(row, "alpha")), _f(_accept(row, "tokens_per_call")),
                             f"{_speedup(row['speedup'], full=False)} ({row['speedup']['n']} prompts)",
                             _f(statistics.mean(medians[d].values()), ".2f", "×"),
                             "" if d == drafts[0] else f"{ahead} of {len(first)}",
                             f"{row['identical']} of {row['greedy_runs']}" if row.get("greedy_runs") else ""])
    header = ["T", "draft", "γ", "α pooled", "τ (tokens per call)", "speedup, median [IQR]",
              "mean of the category medians", "categories ahead of the first", "greedy identical to the target alone"]
    return "\n".join(_table(header, rows)) + "\n"


def render(results: Mapping) -> str:
    """The whole report as markdown."""
    summary = results["summary"]
    lines = _header(results) + _exactness(results)
    lines += _table2(summary) + _table3(summary) + _sweep(summary) + _categories(results)
    lines += _peers(results) + _positions(results) + _costs(results) + _noise(results) + _plots(results)
    return "\n".join(lines).rstrip() + "\n"
