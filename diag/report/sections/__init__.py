"""report.md's sections: one small function each, `rep -> lines` (no lines when the report
lacks the section's data), rendered from report.json only. diag.report.markdown.SECTIONS
lists them in reading order; a new section is a function here and one entry there."""
