"""HF <-> megatron parameter tables, layout transforms and placement plans (one place).

* :mod:`.tables`     - per-architecture rules: megatron name <-> HF name(s), layout kind.
* :mod:`.transforms` - pure HF-full <-> TP-shard functions per layout kind.
* :mod:`.plan`       - every parameter's PP rank / VPP chunk / EP rank, in export order.
"""

from megarl.models.converters.plan import ParamSource, build_plan, dims_of
from megarl.models.converters.tables import TE_ALIASES, ArchTables, Rule, arch_tables
from megarl.models.converters.transforms import Dims, from_shards, is_split, to_shard

__all__ = [
    "ArchTables",
    "Dims",
    "ParamSource",
    "Rule",
    "TE_ALIASES",
    "arch_tables",
    "build_plan",
    "dims_of",
    "from_shards",
    "is_split",
    "to_shard",
]
