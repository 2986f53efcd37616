"""The drafter against the target's tokens: verification, replay over every position, and the
typed evaluation records the rest of diag reads."""
