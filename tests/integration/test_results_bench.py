"""bench/results.py, run small so it cannot rot unnoticed: no figure is asserted here.

A real service collects a 1 MiB JSON Lines result from the bench's own fake provider and
records the lines exactly; the bench read its memory and /healthz meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from bench import results


def test_the_results_bench_collects_a_small_file_exactly(tmp_path: Path) -> None:
    file = tmp_path / "result.jsonl"
    lines, size = results.write_result(file, 1)
    assert size == file.stat().st_size and lines == file.read_bytes().count(b"\n")
    run = results.collect("current", results.ROOT, file, lines, tmp_path / "run")
    assert run.exact and run.state == "completed_with_errors"
    assert run.healthz_ms and run.idle_mib > 0
