"""Report: tables (Markdown, CSV) and plots from run records."""
