"""Report writers: report.json (envelope.py), report.md (markdown.py), the terminal table
(terminal.py), plots (plots.py) and the directory they go to (writer.py)."""
