"""The run report."""

from evotrainer.report.html import write_report

__all__ = ["write_report"]
