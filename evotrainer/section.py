"""The base of every typed settings section (the run config's, the harness's, each domain's env section): an
unknown field is refused, a field's docstring is its description (the knob registry reads it), and a section
does not change once validated (a change is a new section: `model_copy(update=...)`, or an intervention)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
