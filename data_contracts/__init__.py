"""Arrow schemas of every artifact (the catalog). See :mod:`data_contracts.base`."""
from data_contracts.base import (Contract, ContractViolation, atomic_write, atomic_write_bytes,
                                 sha256_file)

__all__ = ["Contract", "ContractViolation", "atomic_write", "atomic_write_bytes", "sha256_file"]
