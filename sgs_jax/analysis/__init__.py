"""Analysis of runs: Lean statement shape (statements), scaling-law fits (scaling),
reading run logs (run_log) and reports with figures (report). Reads logs only."""
