"""What tests, benchmarks and docs share: the servers (servers.py), the one
helper that runs pgqctl processes, workers above all (processes.py), jobs
written as plain SQL (jobrows.py, seed.py), one child run to its end
(runner_helpers.py) and the generated reference (docs_help.py)."""
