"""`PREPROJ`: this method's member of peft's `PeftType` enum, added once at import.

peft keys every method by a member of its closed `PeftType` enum (`register_peft_method` refuses a name the
enum lacks), so a method outside peft's tree must add its member first. This is the one process-wide change
mmpreproj makes at import, and it only adds: no existing member, mapping or peft function is touched.

Adding a member goes through the enum's internals (`_member_map_`, `_value2member_map_`, `_member_names_`),
so it is guarded: outside the peft versions it was tested on (`TESTED_PEFT`, the bound in pyproject.toml), or
on a Python whose enums lack those internals, `import mmpreproj` fails with one line naming the versions,
never with a half-registered method. The floor is the oldest peft whose whole peft test surface passes
(`make test-peft-floor` runs a subset on it). peft 0.20 lacks the tuner's state-dict hooks (a shim routing peft's
state-dict functions through them passed that subset, but not the rest: preproj_lora's stacked files, mixed-batch
errors, add_adapter's record, FSDP2 saves; left for the layout of issue 45);
0.19's `build_peft_weight_mapping` drops a GPT-NeoX adapter's weights in transformers' `load_adapter` (any
method's), 0.18 has no such mapping, 0.16-0.17 do not import under transformers 5, 0.15 has no
`BaseTunerLayer.set_requires_grad`, and `register_peft_method` is new in 0.15.
"""

from __future__ import annotations

import sys

import peft
from packaging.version import Version
from peft.utils.peft_types import PeftType

TESTED_PEFT = ("0.21", "0.22")  # [lowest, first untested): keep equal to pyproject.toml's `peft>=0.21,<0.22`
_ENUM_INTERNALS = ("_member_map_", "_value2member_map_", "_member_names_")


def check_peft_version(version: str | None = None) -> None:
    """ImportError (one line, the versions named) unless peft `version` (default: the installed one) is in
    `TESTED_PEFT` and the enum has the internals `add_peft_type` writes."""
    found = version or peft.__version__
    low, high = TESTED_PEFT
    if not Version(low) <= Version(found) < Version(high):
        raise ImportError(
            f"mmpreproj registers its peft method PREPROJ through peft internals tested on peft >={low},"
            f"<{high}; found peft {found}: pip install 'peft>={low},<{high}'"
        )
    missing = [a for a in _ENUM_INTERNALS if not hasattr(PeftType, a)]
    if missing:
        raise ImportError(
            f"mmpreproj cannot add PREPROJ to peft's PeftType on Python {sys.version.split()[0]}: "
            f"the enum has no {', '.join(missing)} (tested on Python 3.11)"
        )


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


check_peft_version()
PREPROJ = add_peft_type("PREPROJ")
