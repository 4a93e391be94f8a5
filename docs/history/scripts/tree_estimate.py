"""Estimate what a static token tree would add to greedy decoding with an EAGLE draft and prompt lookup.

    python scripts/tree_estimate.py --nodes 1,2,3,4,6,8,12,16              # this machine's T(k)
    python scripts/tree_estimate.py --nodes 1,2,3,4,6,8,12,16 --slope 0    # verification as free as a GPU's

A replay like scripts/draft_length_replay.py's (the same answers, features and costs; it reads its --out).
Each call, prompt lookup proposes up to --lookup-gamma copied tokens. Where it finds none, the draft proposes
a static tree of N nodes instead of a chain. A node is a rank path (r_1, ..., r_d): its j-th token is the
draft's r_j-th most likely token at depth j, after the path before it. At depth j the draft's prediction
is taken teacher forced (`EagleObjective.logits_by_depth`), which is what it computes on the answer's own
path. A call accepts the longest prefix of the answer's own rank path that the tree holds, then one more
token. The tree holds the N prefixes of the answers' rank paths that were most often right on these same
answers, so the estimate is an upper bound for static trees (EAGLE-2's dynamic trees adapt per call).

A call costs T(N + 1) (N nodes verified as a chain of N tokens: the tree's attention mask is left out) plus
the draft's time for d tokens (one step per depth, each step's rows counted as one row). --slope s replaces
the measured T(k)/T(1) by 1 + s (k - 1). Greedy only.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_length_replay import LOOKUP, Call, accepted_prefix, depth_logits, measured_costs, summarize  # noqa: E402
from spec_bench_alpha import add_answer_options, answers_and_features, draft_directory  # noqa: E402

from specdecode.distill.teacher import TeacherData  # noqa: E402
from specdecode.drafters.eagle import load_eagle  # noqa: E402
from specdecode.drafters.prompt_lookup import find_continuation  # noqa: E402

RankPath = tuple[int, ...]  # (r_1, ..., r_d)


def draft_ranks(network, output_ids: torch.Tensor, embedding: torch.Tensor, data: TeacherData,
                features: list[torch.Tensor], depth: int, top: int, batch_tokens: int = 4096) -> list[torch.Tensor]:
    """Per answer [depth, L]: at depth d + 1 and position j, the rank of token j + 1 among the draft's `top` most
    likely tokens (`top` where it is not among them), the d draft tokens before it being the answer's own."""
    out: list[torch.Tensor | None] = [None] * len(data)
    for indices, ids, logits in depth_logits(network, embedding, data, features, depth, batch_tokens):
        best = output_ids[torch.stack([x.topk(top, dim=-1).indices for x in logits])]  # [depth, B, L, top]
        for row, i in enumerate(indices):
            n = len(data.ids[i])
            hits = best[:, row, : n - 1] == ids[row, 1:n, None]  # [depth, n - 1, top]
            ranks = torch.full((depth, n), top, dtype=torch.long)
            ranks[:, : n - 1] = torch.where(hits.any(-1), hits.long().argmax(-1), top)
            out[i] = ranks
    return out


def answer_path(ranks: torch.Tensor, n: int, top: int) -> RankPath:
    """The rank path of the answer's own tokens n, n + 1, ... (after its first n), up to the first outside the top.

    ranks [D, L] (`draft_ranks`): token n + d is the draft's guess at depth d + 1 from position n - 1 + d."""
    path = []
    for d in range(ranks.shape[0]):
        r = int(ranks[d, n - 1 + d]) if n - 1 + d < ranks.shape[1] else top
        if r >= top:
            break
        path.append(r)
    return tuple(path)


def best_tree(ranks: list[torch.Tensor], first: list[int], nodes: int, top: int) -> list[RankPath]:
    """The `nodes` rank-path prefixes most often the answers' own, over every position decoding drafts (all but
    the first answer token, which the prefill gives); prefix-closed; fewer where fewer were ever right."""
    counts: Counter[RankPath] = Counter()
    for r, f in zip(ranks, first):
        for n in range(f + 2, r.shape[1]):
            path = answer_path(r, n, top)
            counts.update(path[: k + 1] for k in range(len(path)))
    return [path for path, _ in counts.most_common(nodes)]


def tree_calls(ids: torch.Tensor, first: int, ranks: torch.Tensor, tree: set[RankPath], lookup_gamma: int, top: int,
               max_new_tokens: int) -> list[Call]:
    """The target calls after the prefill of greedy decoding of the answer in ids [L] (prompt ids[: first + 1]),
    drafting with prompt lookup, else the tree. Call.model_tokens is the tree's depth."""
    answer = len(ids) - first - 1
    depth = max(map(len, tree), default=0)  # an empty tree: the draft never ranked an answer token in its top
    generated, calls = 1, []
    while generated < answer:
        n = first + 1 + generated
        g = min(lookup_gamma, max_new_tokens - generated - 1)
        copied = find_continuation(ids[:n], g, LOOKUP[1], LOOKUP[0]).tolist() if g > 0 else []
        if copied:
            accepted, call = accepted_prefix(ids, n, copied), Call(len(copied), 0, 0)
        elif max_new_tokens - generated - 1 > 0:
            path, accepted = answer_path(ranks, n, top), 0
            while accepted < min(len(path), max_new_tokens - generated - 1) and path[: accepted + 1] in tree:
                accepted += 1
            call = Call(len(tree), depth, 0)
        else:
            accepted, call = 0, Call(0, 0, 0)
        new = min(accepted + 1, answer - generated)
        calls.append(call._replace(new_tokens=new))
        generated += new
    return calls


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"nodes must be comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"nodes must be >= 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_answer_options(parser)
    parser.add_argument("--draft", default="bundled", help="an EAGLE draft directory or 'bundled' (default)")
    parser.add_argument("--nodes", type=_ints, default=_ints("1,2,3,4,6,8,12,16"), help="tree sizes (default 1,2,3,4,6,8,12,16)")
    parser.add_argument("--lookup-gamma", type=int, default=5, help="the most tokens prompt lookup copies (default 5)")
    parser.add_argument("--depth", type=int, default=4, help="the deepest tree level considered (default 4)")
    parser.add_argument("--top", type=int, default=4, help="the draft's most likely tokens a node may branch to (default 4)")
    parser.add_argument("--slope", type=float, default=None, help="T(k)/T(1) = 1 + slope (k - 1) instead of measured")
    parser.add_argument("--cost-reps", type=int, default=15, help="timed repetitions of each extend and proposal (default 15)")
    args = parser.parse_args(argv)
    for name in ("depth", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.lookup_gamma < 0:
        parser.error(f"--lookup-gamma must be >= 0 (0: no prompt lookup), got {args.lookup_gamma}")
    data, native, features = answers_and_features(args.target, args.prompts, args.out, args.max_new_tokens)
    directory = str(draft_directory(args.draft, args.target))
    widest = max(max(args.nodes), args.lookup_gamma) + 1

    measured = range(1, 2) if args.slope is not None else range(1, widest + 1)
    verify, draft = measured_costs(args.target, directory, data, measured, args.depth, args.cost_reps)
    if args.slope is not None:
        verify = {k: 1 + args.slope * (k - 1) for k in range(1, widest + 1)}

    network, output_ids, _ = load_eagle(directory)
    ranks = draft_ranks(network, output_ids, native.embed.weight.detach(), data, features, args.depth, args.top)
    results, trees = {}, {}
    for nodes in args.nodes:
        tree = best_tree(ranks, data.first, nodes, args.top)
        calls = [tree_calls(data.ids[i], data.first[i], ranks[i], set(tree), args.lookup_gamma, args.top,
                            args.max_new_tokens) for i in range(len(data))]
        results[f"{nodes} nodes"] = summarize(calls, data.categories, verify, draft)
        trees[nodes] = tree
    print(f"{len(data)} greedy answers; T(k)/T(1) {', '.join(f'{verify[k]:.2f}' for k in sorted(verify))}; "
          f"draft time / T(1) {', '.join(f'{v:.3f}' for v in draft.values())}\n")
    print("| nodes | tree (rank paths) | tokens per call | speedup, median | mean of the category medians |\n|---|---|---|---|---|")
    for nodes in args.nodes:
        r = results[f"{nodes} nodes"]["all"]
        shown = " ".join("".join(map(str, p)) for p in trees[nodes]) if nodes <= 8 else f"{nodes} paths"
        print(f"| {nodes} | {shown} | {r['tokens_per_call']:.2f} | {r['speedup']:.2f}× | {r['mean_of_category_medians']:.2f}× |")
    return {"results": results, "trees": trees, "verify": verify, "draft": draft}


if __name__ == "__main__":
    main()
