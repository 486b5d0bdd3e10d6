"""Record: the base of the typed records a run's ledger holds as JSON and reads back (stage results, trials,
verdicts), loading the JSON of older versions and writing the keys they wrote."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class Record(BaseModel):
    # Records are read back from ledgers of older versions: keys a later version dropped are ignored;
    # a key that is missing (required, no default) fails validation instead of reading as empty.
    model_config = ConfigDict(extra="ignore")

    OMIT_NONE: ClassVar[tuple[str, ...]] = ()
    """Keys written only when they hold a value, as the dicts these records replaced wrote them: a reader of the
    ledger's JSON (an older version, a benchmark, a user's query) tells the cases apart by the key's presence."""

    OMIT_DEFAULT: ClassVar[tuple[str, ...]] = ()
    """Keys added after ledgers were written without them, written only when they differ from their default:
    an older record then writes back the JSON it was read from."""

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        for key in self.OMIT_NONE:
            if data.get(key, 0) is None:
                del data[key]
        for key in self.OMIT_DEFAULT:
            if key in data and data[key] == type(self).model_fields[key].default:
                del data[key]
        return data
