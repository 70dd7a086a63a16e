"""One-off scripts run from the repository root (`python -m bench.calibrate`, `bench.validate_sim`,
`bench.unequal_pool`); they are not installed and import from the installed `clasp` package. The
benchmarks that `clasp bench` and `python -m clasp.bench.NAME` run live in `clasp.bench`."""
