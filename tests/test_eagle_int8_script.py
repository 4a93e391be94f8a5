"""scripts/eagle_int8.py on a tiny target and its EAGLE draft: both kinds run, step costs and decoding are reported."""

from __future__ import annotations

import json

from script_loading import load_script
from test_distill import eagle_distilled, tiny_target  # noqa: F401  (fixtures)


def test_eagle_int8_script_reports_costs_and_decoding(eagle_distilled, tiny_target, tmp_path, capsys):  # noqa: F811
    script = load_script("eagle_int8")
    target, _ = tiny_target
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": c, "turns": [f"tell me about {c}"]}) for c in ("a", "b", "a")))
    out = script.main(["--target", str(target), "--draft", str(eagle_distilled[0] / "draft"), "--prompts", str(prompts),
                       "--max-new-tokens", "8", "--reps", "2"])
    assert set(out["step_ms"]) == {"target", "none x1", "none x2", "int8 x1", "int8 x2"}
    assert all(v > 0 for v in out["step_ms"].values())
    for temperature in (0.0, 1.0):
        for kind in ("none", "int8"):
            measured = out["decoding"][temperature][kind]
            assert 0 <= measured["alpha"] <= 1 and measured["speedup"] > 0 and measured["c_run"] > 0
    assert "c (one position):" in capsys.readouterr().out
