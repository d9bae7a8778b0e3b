"""The data wing of :mod:`slmlab.transactions` (it imports nothing else of the package): the schema
and its tokenisation (:mod:`.schema`), the synthetic generator (:mod:`.synth`), real exports through a
column map (:mod:`.adapter`), bank folders and the encoded, split :class:`Bank` (:mod:`.bank`), and
windows over customer histories with the harness data source (:mod:`.windows`).
"""

from .bank import Bank, export, label_customers, load_bank, prepare_bank, split_cuts
from .schema import FittedSchema, SchemaConfig, load_schema
from .synth import BehaviourConfig, SynthConfig, SynthData, generate
from .windows import TransactionWindows, WindowBatch, WindowOptions, Windows, balance_windows, build_windows

__all__ = [
    "Bank",
    "BehaviourConfig",
    "FittedSchema",
    "SchemaConfig",
    "SynthConfig",
    "SynthData",
    "TransactionWindows",
    "WindowBatch",
    "WindowOptions",
    "Windows",
    "balance_windows",
    "build_windows",
    "export",
    "generate",
    "label_customers",
    "load_bank",
    "load_schema",
    "prepare_bank",
    "split_cuts",
]
