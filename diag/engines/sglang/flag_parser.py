"""How SGLang's argument parser reads a launch line, release by release.

ServerArgs' parser is a plain `argparse.ArgumentParser()` (allow_abbrev on), filled by
`ServerArgs.add_cli_args`; the option strings and their nargs per release are the generated
table in server_flags.json. argparse (Python 3.11, `_parse_optional` / `_get_option_tuples`)
reads each word that starts with "--" as:
1. an exact option string: `--model` is `--model` (an alias of `--model-path`);
2. `--flag=value`: the part before "=" looked up exactly;
3. else every option string that starts with the word (or its part before "="):
   one       -> that option, an abbreviation: `--speculative-num-step` -> `--speculative-num-steps`;
   several   -> "ambiguous option": `--speculative-num` could match `--speculative-num-draft-tokens`,
                `--speculative-num-steps`;
   none      -> "unrecognized arguments": `--speculative-algoritm`.
Values: a switch (nargs 0) takes none, nargs 1 the next word unless that word looks like an
option ("-x", but not a negative number such as "-1"), "?" zero or one, "+" one or more,
"*" any number.
`--speculative-algorithm` values: checked by argparse `choices` (case-sensitive) up to 0.5.11,
by `SpeculativeAlgorithm.from_string` (upper-cased) at launch from 0.5.12.post1.

This module knows words and the table; it reads no files and knows nothing about models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.engines.common import FlagProblem
from diag.engines.sglang import server_flags
from diag.engines.sglang.versions import release

_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class FlagTable:
    """One release's flags. `version` is the release the table was generated from, which is
    the nearest at or below the one asked for (`exact` False when they differ)."""

    version: str
    asked: str
    flags: dict[str, object]           # option string -> nargs
    algorithms: tuple[str, ...]
    algorithms_checked_by: str         # "argparse" | "from_string"

    @property
    def exact(self) -> bool:
        return self.version == self.asked


def table_for(version: str) -> FlagTable | None:
    """The flag table for `version` ("0.5.23"): its own, else the nearest generated release
    below it; None when it is older than every generated one.
    Example: "0.5.16" -> the 0.5.14 table (exact False)."""
    known = sorted(server_flags.FLAGS, key=release)
    at_or_below = [v for v in known if release(v) <= release(version)]
    if not at_or_below:
        return None
    v = at_or_below[-1]
    checked_by, names = server_flags.ALGORITHMS[v]
    return FlagTable(v, version, server_flags.FLAGS[v], names, checked_by)


@dataclass(frozen=True)
class Word:
    """One option word of a launch line as argparse reads it.
    kind: "exact" | "prefix" (an abbreviation of `option`) | "ambiguous" (`candidates`) |
    "unknown" | "stray" (a value word no option takes)."""

    written: str
    kind: str
    option: str | None
    candidates: tuple[str, ...]
    values: tuple[str, ...]

    @property
    def value(self) -> str | None:
        return " ".join(self.values) if self.values else None


def resolve(word: str, table: FlagTable) -> tuple[str, str | None, tuple[str, ...]]:
    """(kind, option, candidates) for one "--..." word (see the module docstring).
    Examples (0.5.23): "--speculative-num-step" -> ("prefix", "--speculative-num-steps", ());
    "--speculative-num" -> ("ambiguous", None, ("--speculative-num-draft-tokens",
    "--speculative-num-steps")); "--tp=8" -> ("exact", "--tp", ())."""
    flag = word.split("=", 1)[0]
    if word in table.flags or flag in table.flags:
        return "exact", word if word in table.flags else flag, ()
    matches = tuple(sorted(o for o in table.flags if o.startswith(flag)))
    if len(matches) == 1:
        return "prefix", matches[0], ()
    if matches:
        return "ambiguous", None, matches
    return "unknown", None, ()


def _is_value(word: str) -> bool:
    return not word.startswith("-") or bool(_NEGATIVE.match(word))


def _take(nargs, rest: list[str]) -> int:
    """How many of the following words an option with this nargs consumes."""
    run = 0
    while run < len(rest) and _is_value(rest[run]):
        run += 1
    if nargs == 0:
        return 0
    if nargs in (1, None, "?"):
        return min(run, 1)
    if isinstance(nargs, int):
        return min(run, nargs)
    return run                                   # "+" and "*"


def read_argv(argv: list[str], table: FlagTable) -> list[Word]:
    """Every option word of `argv` (the words after the program), with its values.
    An unknown or ambiguous option keeps the next value-looking word, as a reader would
    expect it to; a value word nothing takes is a "stray" Word. Never raises.
    Example: ["--tp", "8", "--speculative-num-step", "3", "--enable-dp-attention", "x"] ->
    exact --tp ("8",), prefix --speculative-num-steps ("3",), exact --enable-dp-attention (),
    stray "x"."""
    out: list[Word] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if _is_value(word):
            out.append(Word(word, "stray", None, (), ()))
            i += 1
            continue
        kind, option, cands = resolve(word, table)
        if "=" in word:
            out.append(Word(word.split("=", 1)[0], kind, option, cands, (word.split("=", 1)[1],)))
            i += 1
            continue
        n = _take(table.flags[option] if option else 1, argv[i + 1:])
        out.append(Word(word, kind, option, cands, tuple(argv[i + 1:i + 1 + n])))
        i += 1 + n
    return out


def algorithm_problem(value: str, table: FlagTable) -> str | None:
    """Why this release refuses `--speculative-algorithm value`, or None.
    Examples: "EAGEL3" on 0.5.23 -> "ValueError: Unknown speculative algorithm name: EAGEL3 ...";
    "eagle3" on 0.5.6 -> "argparse: invalid choice: 'eagle3' ..." (choices are case-sensitive)."""
    names = ", ".join(table.algorithms)
    if table.algorithms_checked_by == "argparse":
        if value in table.algorithms:
            return None
        return (f"argparse: argument --speculative-algorithm: invalid choice: {value!r} "
                f"(choose from {names}); the server exits before loading anything")
    if value.upper() in table.algorithms:
        return None
    return (f"ValueError: Unknown speculative algorithm name: {value} (SpeculativeAlgorithm.from_string "
            f"accepts {names}, any case); the launch fails while resolving its arguments")


def _close(word: str, table: FlagTable) -> str:
    import difflib
    near = difflib.get_close_matches(word.split("=", 1)[0], list(table.flags), n=3, cutoff=0.75)
    return f"did you mean {' or '.join(near)}?" if near else "see `python -m sglang.launch_server --help`"


def _word_problem(w: Word, table: FlagTable, label: str) -> FlagProblem | None:
    if w.kind == "stray":
        return FlagProblem("STRAY_WORD", "error", w.written, f"{w.written!r} follows no option that takes it",
                           f"argparse: unrecognized arguments: {w.written}; {label} exits at launch",
                           "remove it, or give it to the option it belongs to")
    if w.kind == "unknown":
        sev = "error" if table.exact else "warning"
        return FlagProblem("UNKNOWN_FLAG", sev, w.written, f"{w.written} is not a flag of {label}",
                           f"argparse: unrecognized arguments: {w.written}; the server exits before "
                           f"loading anything", _close(w.written, table))
    if w.kind == "ambiguous":
        return FlagProblem("AMBIGUOUS_FLAG", "error", w.written, f"{w.written} abbreviates several flags",
                           f"argparse: ambiguous option: {w.written} could match {', '.join(w.candidates)}",
                           "spell the flag out in full")
    nargs = table.flags[w.option]
    if nargs == 0 and w.values:
        return FlagProblem("SWITCH_WITH_VALUE", "error", w.written, f"{w.written} is a switch and takes no value",
                           f"argparse: argument {w.option}: ignored explicit argument {w.values[0]!r}",
                           f"write {w.option} alone")
    if (nargs in (1, "+") or isinstance(nargs, int) and nargs > 0) and not w.values:
        return FlagProblem("FLAG_NEEDS_VALUE", "error", w.written, f"{w.written} needs a value",
                           f"argparse: argument {w.option}: expected one argument", f"write {w.option} VALUE")
    if w.kind == "prefix":
        return FlagProblem("ABBREVIATED_FLAG", "warning", w.written,
                           f"{w.written} is an abbreviation: {label}'s argparse reads it as {w.option}",
                           f"runs as {w.option}" + (f" {w.value}" if w.value else ""),
                           f"spell it out as {w.option}: an abbreviation fails as ambiguous once a "
                           f"release adds another flag with the same prefix")
    return None


def flag_problems(argv: list[str], table: FlagTable) -> list[FlagProblem]:
    """Every word of `argv` (after the program) this release's parser refuses or re-reads,
    and a --speculative-algorithm value it does not know.
    Example (0.5.23): ["--speculative-algoritm", "EAGLE3"] -> UNKNOWN_FLAG (did you mean
    --speculative-algorithm?); ["--speculative-algorithm", "EAGEL3"] -> UNKNOWN_ALGORITHM."""
    label = f"SGLang {table.version}"
    out = []
    for w in read_argv(argv, table):
        if (p := _word_problem(w, table, label)) is not None:
            out.append(p)
        if w.option == "--speculative-algorithm" and w.value is not None:
            why = algorithm_problem(w.value, table)
            if why is not None:
                out.append(FlagProblem("UNKNOWN_ALGORITHM", "error", w.option,
                                       f"--speculative-algorithm {w.value} is not an algorithm {label} knows",
                                       why, "use EAGLE3 for an EAGLE-3 drafter"))
    return out
