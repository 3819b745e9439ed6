"""Seeded draws shared by the conformance case generators."""


def pick(rng, weighted):
    """weighted: list of (weight, value)."""
    total = sum(w for w, _ in weighted)
    x = rng.uniform(0, total)
    for w, v in weighted:
        x -= w
        if x <= 0:
            return v
    return weighted[-1][1]
