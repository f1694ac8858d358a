"""Run reports: figures, the summary table, and their assembly (build_report)."""
