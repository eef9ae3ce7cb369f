"""Verdicts → reports: tables as data, then Rich, Markdown, JSON (and JUnit, baselines)."""
