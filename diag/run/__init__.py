"""Running a case end to end: the case file, prompts, candidate layouts, the target passes, the
evaluations, verdicts and the pipeline that connects them (and runs the diagnoses, diag/diagnoses/)."""
