"""User-facing errors. Every failure a user can cause names where, what was
expected and what was found; this module knows nothing else."""

from __future__ import annotations


class DiagError(Exception):
    """An error the user caused and can fix.

    Example: DiagError("drafter fc width does not match the layout",
    file="drafter/model.safetensors", field="fc.weight",
    expected="[128, 384] (3 capture points x hidden 128)", found="[128, 256]")
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 expected: object = None, found: object = None, hint: str | None = None):
        self.message, self.file, self.field = message, file, field
        self.expected, self.found, self.hint = expected, found, hint
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.message]
        if self.file is not None:
            parts.append(f"  file:     {self.file}")
        if self.field is not None:
            parts.append(f"  field:    {self.field}")
        if self.expected is not None:
            parts.append(f"  expected: {self.expected}")
        if self.found is not None:
            parts.append(f"  found:    {self.found}")
        if self.hint is not None:
            parts.append(f"  hint:     {self.hint}")
        return "\n".join(parts)
