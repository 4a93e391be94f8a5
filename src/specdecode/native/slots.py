"""Many sequences in one static KV cache, each in its own slot, decoded by shared forward passes.

`SlotCache` holds keys and values [S, KV, T, D] per layer: slot s, position t. `forward_rows` runs one forward
pass over the new tokens of several sequences at once: the matmuls take every sequence's rows together (on a
memory-bound engine B rows cost little more than one), attention is one padded call over the slots, each query
row masked to its own slot's positions 0 .. its position. Each slot keeps its own length, so a slot rolls back,
is freed or is taken by a new sequence without touching the others.

Shapes: N rows of all sequences together, B the slots spanned (0 .. highest slot in the pass), R the most rows
of one sequence, H query heads, KV key/value heads, G = H / KV, D head_dim, T positions per slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdecode.native.model import KVCache, NativeTransformer, attention_mask

__all__ = ["SlotCache", "SlotRows", "forward_rows"]


class SlotCache:
    """Keys and values of `num_slots` sequences of up to `max_len` positions each, in one block.

    Positions a slot has not written yet may be read (masked) by a padded attention call, so the block is zeroed
    slot by slot up to the furthest position any pass reached (`initialize`): stale values of a rolled-back or
    finished sequence are finite and masked, never-written memory might hold NaN.
    """

    def __init__(self, model: NativeTransformer, num_slots: int, max_len: int) -> None:
        config = model.config
        model.ensure_rope(max_len)
        self.config = config
        self.num_slots, self.max_len = num_slots, max_len
        shape = (2, config.num_layers, num_slots, config.num_kv_heads, max_len, config.head_dim)
        self.storage = torch.empty(shape, dtype=model.dtype, device=model.device)  # pages resident as they are used
        self.k = list(self.storage[0].unbind(0))  # [S, KV, T, D] per layer
        self.v = list(self.storage[1].unbind(0))
        self.features: torch.Tensor | None = None  # [S, T, hidden], once keep_features asks
        self._initialized = [0] * num_slots  # positions [0, n) of slot s hold finite values

    def keep_features(self) -> None:
        """From now on, passes also write each position's final-norm output into features[slot, position]."""
        if self.features is None:
            shape = (self.num_slots, self.max_len, self.config.hidden_size)
            self.features = torch.empty(shape, dtype=self.storage.dtype, device=self.storage.device)

    def slot(self, s: int) -> KVCache:
        """Slot s as a single-sequence `KVCache` (views, nothing copied), for `NativeTransformer.forward`."""
        view = KVCache(self.config, self.max_len, self.storage.dtype, self.storage.device,
                       storage=self.storage[:, :, s : s + 1])
        if self.features is not None:
            view.features = self.features[s]
        return view

    def wrote(self, s: int, end: int) -> None:
        """Slot s now holds finite values at positions [0, end)."""
        self._initialized[s] = max(self._initialized[s], end)

    def initialize(self, slots: int, end: int) -> None:
        """Make positions [0, end) of slots [0, slots) finite (zero what was never written)."""
        for s in range(slots):
            start = self._initialized[s]
            if start < end:
                self.storage[:, :, s, :, start:end].zero_()
                if self.features is not None:
                    self.features[s, start:end].zero_()
                self._initialized[s] = end

    def nbytes(self) -> int:
        extra = 0 if self.features is None else self.features.numel() * self.features.element_size()
        return self.storage.numel() * self.storage.element_size() + extra


@dataclass(frozen=True)
class SlotRows:
    """One sequence's part of a pass: `tokens` [n] fed at positions start .. start + n - 1 of slot `slot`;
    last_only: only the last row's logits are wanted (a prompt)."""

    slot: int
    tokens: torch.Tensor
    start: int
    last_only: bool = False


# a sequence feeding more rows (a prompt) attends on its own: padding every sequence to its rows would cost more
PADDED_ROWS = 8


def forward_rows(model: NativeTransformer, cache: SlotCache, batch: Sequence[SlotRows]) -> list[torch.Tensor]:
    """Logits [n_i, V] (float32; [1, V] for a last_only part) for each sequence of `batch` (distinct slots), in
    one forward pass.

    Row j of sequence i predicts the token after tokens[j], as `NativeTransformer.forward` does for one
    sequence; the results agree with it up to float rounding (the matmuls see other rows beside them). The
    matmuls take every row at once; attention is one padded call over the slots of the parts of at most
    PADDED_ROWS rows, and a call of its own for each longer part.
    """
    config = model.config
    h, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
    g = h // kv
    device = model.device
    counts = [part.tokens.numel() for part in batch]
    offsets = [sum(counts[:i]) for i in range(len(batch))]  # each part's first row among the N
    short = [i for i, n in enumerate(counts) if n <= PADDED_ROWS]
    long = [i for i, n in enumerate(counts) if n > PADDED_ROWS]
    ids = torch.cat([part.tokens for part in batch]).to(device)  # [N]
    slot_of = torch.cat([torch.full((n,), part.slot, dtype=torch.long) for part, n in zip(batch, counts)]).to(device)
    positions = torch.cat([torch.arange(part.start, part.start + n) for part, n in zip(batch, counts)]).to(device)
    cache.initialize(max(part.slot for part in batch) + 1, max(part.start + n for part, n in zip(batch, counts)))

    padded = _PaddedAttention(batch, counts, offsets, short, g, device) if short else None
    own_masks = {i: attention_mask(positions[offsets[i] : offsets[i] + counts[i]], batch[i].start + counts[i], g)
                 for i in long}  # [G*n, end]
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]  # [N, 1, D]
    x = model.embed(ids)  # [N, hidden]
    for layer, k_cache, v_cache in zip(model.layers, cache.k, cache.v):
        q, k, v = layer.project(x, cos, sin)  # [N, H, D], [N, KV, D], [N, KV, D]
        k_cache[slot_of, :, positions] = k
        v_cache[slot_of, :, positions] = v
        attended = q.new_empty(q.shape[0], h * d)  # [N, H*D], head-major
        if padded is not None:
            attended[padded.rows] = padded(q, k_cache, v_cache)
        for i in long:
            part, n, first = batch[i], counts[i], offsets[i]
            end, slot = part.start + n, part.slot
            folded = q[first : first + n].reshape(n, kv, g, d).permute(1, 2, 0, 3).reshape(1, kv, g * n, d)
            out = F.scaled_dot_product_attention(folded, k_cache[slot : slot + 1, :, :end],
                                                 v_cache[slot : slot + 1, :, :end], attn_mask=own_masks[i])
            attended[first : first + n] = out.view(kv, g, n, d).permute(2, 0, 1, 3).reshape(n, h * d)
        x = layer.output_and_mlp(x, attended)  # [N, hidden]
    x = model.norm(x)
    if cache.features is not None:
        cache.features[slot_of, positions] = x
    for part, n in zip(batch, counts):
        cache.wrote(part.slot, part.start + n)
    wanted = [range(first + n - 1, first + n) if part.last_only else range(first, first + n)
              for part, n, first in zip(batch, counts, offsets)]
    rows = torch.tensor([r for span in wanted for r in span], device=device)
    return list(model.lm_head(x[rows]).float().split([len(span) for span in wanted]))


class _PaddedAttention:
    """Attention of the short parts in one call: queries padded to [B, KV, G*R, D] over the slots 0 .. B - 1 they
    span, each query row masked to its own slot's positions 0 .. its position (padding rows to position 0)."""

    def __init__(self, batch: Sequence[SlotRows], counts: list[int], offsets: list[int], short: list[int], g: int,
                 device) -> None:
        self.rows_per = max(counts[i] for i in short)  # R
        self.spanned = max(batch[i].slot for i in short) + 1  # B
        self.end = max(batch[i].start + counts[i] for i in short)
        self.g = g
        self.rows = torch.cat([torch.arange(offsets[i], offsets[i] + counts[i]) for i in short]).to(device)  # [M]
        self.slot_of = torch.cat([torch.full((counts[i],), batch[i].slot, dtype=torch.long) for i in short]).to(device)
        self.row_of = torch.cat([torch.arange(counts[i]) for i in short]).to(device)
        positions = torch.cat([torch.arange(batch[i].start, batch[i].start + counts[i]) for i in short]).to(device)
        grid = torch.zeros(self.spanned, self.rows_per, dtype=torch.long, device=device)  # [B, R]
        grid[self.slot_of, self.row_of] = positions
        allowed = torch.arange(self.end, device=device)[None, None, :] <= grid[:, :, None]  # [B, R, end]
        self.mask = allowed[:, None, None].expand(self.spanned, 1, g, self.rows_per, self.end).reshape(
            self.spanned, 1, g * self.rows_per, self.end)

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """The attended values [M, H*D] of the short parts' rows, from q [N, H, D] and the layer's cache."""
        b, r, g, end = self.spanned, self.rows_per, self.g, self.end
        _, h, d = q.shape
        kv = h // g
        padded = q.new_zeros(b, r, h, d)
        padded[self.slot_of, self.row_of] = q[self.rows]
        # fold the G heads of a key/value head into the query length, as DecoderLayer does: [B, KV, G*R, D]
        padded = padded.view(b, r, kv, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv, g * r, d)
        out = F.scaled_dot_product_attention(padded, k_cache[:b, :, :end], v_cache[:b, :, :end], attn_mask=self.mask)
        out = out.view(b, kv, g, r, d).permute(0, 3, 1, 2, 4).reshape(b, r, h * d)
        return out[self.slot_of, self.row_of]  # [M, H*D]
