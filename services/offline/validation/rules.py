"""Which release's rules apply: the Kubernetes minor and the gates that change them."""

from __future__ import annotations

from dataclasses import dataclass

from services.allocator.structured.features import Features


@dataclass(frozen=True, slots=True)
class Rules:
    """What differs by Kubernetes minor and gates in the rules of this package."""

    minor: int = 37
    consumable_capacity: bool = True
    fractional_range: bool = True  # DRAFractionalCapacityRange (1.37)

    @classmethod
    def of(cls, features: Features | None) -> Rules:
        if features is None:
            return cls()
        return cls(
            minor=features.minor,
            consumable_capacity=features.consumable_capacity,
            fractional_range=features.fractional_capacity_range,
        )


#: The newest release's rules, for checks that do not differ between releases.
LATEST = Rules()
