"""The ingest-scaling benchmark end to end: real clusters, every round exact, medians over alternating rounds."""

import json

from clasp.bench import ingest_scaling


def test_rounds_alternate_the_worker_counts_and_report_medians(tmp_path, capsys):
    out = tmp_path / "scaling.json"
    rc = ingest_scaling.main(["--workers", "1,2", "--cpu-per-worker", "0", "--lines-per-worker", "1500",
                              "--rounds", "3", "--checkpoint-interval", "0.5", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    order = [line.split(",")[1].strip() for line in capsys.readouterr().err.splitlines() if line.startswith("sources,")]
    assert order == ["1 workers", "2 workers", "2 workers", "1 workers", "1 workers", "2 workers"]
    rows = {r["workers"]: r for r in result["sources"]}
    for n, row in rows.items():
        assert row["lines"] == n * 1500
        assert len(row["rounds_lines_per_s"]) == 3
        assert row["lines_per_s"] == sorted(row["rounds_lines_per_s"])[1]
    assert result["speedup"] == {"1": 1.0, "2": round(rows[2]["lines_per_s"] / rows[1]["lines_per_s"], 2)}


def test_median_run_keeps_the_median_rounds_fields():
    rounds = [{"lines_per_s": v, "wall_s": w} for v, w in ((30.0, 1.0), (10.0, 3.0), (20.0, 1.5), (40.0, 0.7))]
    row = ingest_scaling.median_run(rounds)
    assert row["lines_per_s"] == 25.0
    assert row["wall_s"] == 1.5
    assert row["rounds_lines_per_s"] == [30.0, 10.0, 20.0, 40.0]
