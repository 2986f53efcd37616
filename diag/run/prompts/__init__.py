"""Prompt files as users have them (formats.py), read into typed prompt sets (read.py).

    from diag.run.prompts import read_prompt_set, tokenize
    pset = read_prompt_set("question.jsonl")      # MT-bench, ShareGPT, GSM8K, HumanEval, ...
"""

from diag.run.prompts.formats import FORMATS, format_of, parse_record
from diag.run.prompts.read import read_prompt_set, read_recorded, tokenize
from diag.run.prompts.records import Prompt, PromptSet

__all__ = ["FORMATS", "Prompt", "PromptSet", "format_of", "parse_record", "read_prompt_set",
           "read_recorded", "tokenize"]
