"""Running a case end to end: the case file, prompts, candidate layouts, step costs, the speedup
model, verdicts and the pipeline that connects them."""
