"""Native (C/C++) stacks of CPU samples: DWARF CFI unwinding of a copied user
stack with libdw, and symbolization (see :mod:`.unwinder`)."""

from otelbpf.profiles.native.unwinder import (
    EVAL_FRAME,
    NREGS,
    NativeUnwinder,
    UnwoundStack,
    is_eval_frame,
)

__all__ = ["EVAL_FRAME", "NREGS", "NativeUnwinder", "UnwoundStack", "is_eval_frame"]
