"""scripts/load_test.py end to end on tiny random models: a started server, concurrent streams, and the files it
writes (the table the docs generate from its results.json, the machine and the server's own view)."""

from __future__ import annotations

import json

from script_loading import load_script

from specdecode.bench.load_report import load_test_table, runs_of


def test_the_load_test_records_what_the_docs_generate_its_table_from(tmp_path):
    load_test = load_script("load_test")
    status = load_test.main(["--tiny", "--clients", "3", "--requests", "4", "--max-tokens", "6", "--prompts", "2",
                             "--out", str(tmp_path)])
    assert status == 0  # no errors, no mismatches against each prompt decoded alone
    results = json.loads((tmp_path / "results.json").read_text())
    [run] = results["runs"]
    assert run["requests"] == 4 and run["ok"] == 4 and run["errors"] == 0 and run["mismatches"] == 0
    assert run["completion_tokens"] > 0 and run["tokens_per_s"] > 0
    assert results["machine"]["cpu"] and results["machine"]["versions"]["torch"]
    assert run["server_health"]["status"] == "ok" and run["server_health"]["max_batch"] >= 1
    assert (tmp_path / "report.md").read_text() == load_test_table(results["runs"])
    assert "| specdecode serve --max-batch default | 3 | 4 | 0 | 0 |" in load_test_table(results["runs"])


def test_a_run_written_before_peers_were_measured_counts_as_ours():
    run = {"clients": 2, "requests": 2, "errors": 0, "mismatches": 0, "tokens_per_s": 10.0, "latency_p50_s": 1.0,
           "latency_p95_s": 1.0, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2, "max_batch": 1}
    peer = {**run, "server": "llama_cpp.server", "tokens_per_s": 5.0, "ttft_p95_s": 0.4}
    table = load_test_table([run, {**run, "max_batch": 4, "tokens_per_s": 30.0, "backend": "native"}, peer])
    assert "| specdecode serve --max-batch 1 | 2 | 2 | 0 | 0 | 10.0 | 1.00x |" in table
    assert "| specdecode serve --backend native --max-batch 4 | 2 | 2 | 0 | 0 | 30.0 | 3.00x |" in table
    assert "| llama_cpp.server | 2 | 2 | 0 | 0 | 5.0 | 0.50x |" in table and "| 2.00 |" in table


def test_older_results_give_their_runs_the_backend_of_their_args():
    results = {"args": {"backend": "native"}, "runs": [{"clients": 1}]}
    assert runs_of(results) == [{"backend": "native", "clients": 1}]
    assert runs_of({"args": {"backend": "None"}, "runs": [{"clients": 1}]}) == [{"backend": None, "clients": 1}]
