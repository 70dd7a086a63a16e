"""The paper's seven benchmark applications (Fig. 1), each a module with the same small API.

Every app module has `NAME`, `build_dag() -> clasp.Dag`, `generate(n, seed) -> list` (seeded input),
`expected(records)` (the exact answer, computed without any runtime) and `result(job)` (the same answer
read from a finished job's `state()` / `collected()`), so that `result(job) == expected(records)`.
"""

from __future__ import annotations

from types import ModuleType

from clasp.apps import aa, etl, nwm, pl, sd, syn, wc

APPS: dict[str, ModuleType] = {m.NAME: m for m in (wc, sd, aa, pl, nwm, etl, syn)}


def get_app(name: str) -> ModuleType:
    """The app module called `name` (or "synN": SYN with N operators, a calibration variant not in APPS);
    ValueError naming the accepted ones otherwise."""
    try:
        return APPS[name]
    except (KeyError, TypeError):
        if isinstance(name, str) and name.startswith(syn.NAME) and name[len(syn.NAME):].isdigit():
            return syn.chain(int(name[len(syn.NAME):]))  # type: ignore[return-value]
        raise ValueError(f"unknown app {name!r}; accepted: {', '.join(APPS)} (and synN, SYN of N operators)") \
            from None
