"""Start-up cost: what `import specdecode` and building a native model pull in.

Time to first token on the native engine is mostly imports; transformers' modeling code and
torch._dynamo each add seconds. These checks run in a fresh interpreter, so they fail as soon as
a module-level import brings either back.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _fresh_python(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_importing_the_package_and_cli_leaves_transformers_unloaded():
    _fresh_python(
        """
        import sys
        import specdecode, specdecode.cli, specdecode.native.loading, specdecode.pipeline
        loaded = sorted(m for m in sys.modules if m == "transformers" or m.startswith("transformers."))
        assert not loaded, loaded[:10]
        """
    )


def test_hf_names_still_import_on_demand():
    _fresh_python(
        """
        from specdecode import wrap_hf_model
        from specdecode.models import HFCausalLM
        assert callable(wrap_hf_model) and HFCausalLM.__name__ == "HFCausalLM"
        """
    )


def test_building_a_native_model_does_not_import_dynamo_or_transformers_modeling():
    _fresh_python(
        """
        import sys
        import torch
        from specdecode.native.config import NativeConfig
        from specdecode.native.loading import _build
        from specdecode.native.model import NativeTransformer

        config = NativeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                              num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
        reference = NativeTransformer(config)  # randomly initialised on the CPU: the weights to load
        state = {k: v for k, v in reference.state_dict().items() if k != "lm_head.weight"}  # tied to embed
        model = _build(config, state, torch.float32)
        assert torch.equal(model.layers[0].qkv.weight, reference.layers[0].qkv.weight)
        assert "torch._dynamo" not in sys.modules
        assert "transformers.modeling_utils" not in sys.modules
        """
    )
