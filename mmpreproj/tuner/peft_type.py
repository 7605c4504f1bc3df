"""`PREPROJ`: this method's member of peft's `PeftType` enum, added once at import.

peft keys every method by a member of its closed `PeftType` enum (`register_peft_method` refuses a name the
enum lacks), so a method outside peft's tree must add its member first. This is the one process-wide change
mmpreproj makes at import, and it only adds: no existing member, mapping or peft function is touched.
"""

from __future__ import annotations

from peft.utils.peft_types import PeftType

__all__ = ["PREPROJ", "add_peft_type"]


def add_peft_type(name: str) -> PeftType:
    """`PeftType[name]`, added to the enum if absent (value == name, like peft's own members); idempotent."""
    if name in PeftType.__members__:
        return PeftType[name]
    member = str.__new__(PeftType, name)
    member._name_, member._value_ = name, name
    member._sort_order_ = len(PeftType._member_names_)
    PeftType._member_map_[name] = member
    PeftType._value2member_map_[name] = member
    PeftType._member_names_.append(name)
    type.__setattr__(PeftType, name, member)  # what `PeftType.PREPROJ` reads (EnumType.__setattr__ refuses members)
    return member


PREPROJ = add_peft_type("PREPROJ")
