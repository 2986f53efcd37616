"""The engine-neutral records the EngineRules protocol (protocol.py) speaks in.

ServingPlan / ServingError / Fix (what a release feeds a drafter and how to change it),
ResolvedShape (the tree a release runs for its launch flags), LaunchFlags / EffectiveConfig /
FlagProblem (a launch line read and linted), DraftTables (whose embedding and lm_head the draft
uses) and SampledRound (one sampled verify round). Every family fills these; none of them
names a family. This module holds types; it computes nothing.
"""

from __future__ import annotations

from diag.engine.draft_tables import DraftTables
from diag.engine.flag_parser import FlagProblem
from diag.engine.launch import EffectiveConfig, LaunchFlags
from diag.engine.serving import DeclaredLayout, Fix, ServingError, ServingPlan
from diag.engine.tree_rules import ResolvedShape
from diag.replay.sampling import SampledRound

__all__ = ["DeclaredLayout", "DraftTables", "EffectiveConfig", "FlagProblem", "Fix", "LaunchFlags",
           "ResolvedShape", "SampledRound", "ServingError", "ServingPlan"]
