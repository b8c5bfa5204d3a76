"""The runs of an experiment grid, declared as data: (method, budget or time budget, seed),
each with its folder name and the params it sets."""

from __future__ import annotations

from dataclasses import dataclass

from clusterft.spec.methods import METHODS, time_budgeted


@dataclass(frozen=True)
class RunSpec:
    method: str
    budget: float | None
    seed: int
    time_budget: float | None = None  # select.time_budget: the data budget is planned from it

    @property
    def label(self) -> str:
        """The method as the report groups it: a time-budgeted run is its own series."""
        return self.method if self.time_budget is None else f"{self.method}-t{self.time_budget:.10g}"

    @property
    def name(self) -> str:
        b = "" if self.budget is None else f"-b{self.budget:g}"
        t = "" if self.time_budget is None else f"-t{self.time_budget:.10g}"
        return f"{self.method}{b}{t}-s{self.seed}"

    def overrides(self) -> list[str]:
        out = [f"select.seed={self.seed}", f"train.seed={self.seed}",
               f"select.time_budget={self.time_budget or 0}"]
        key = METHODS[self.method].budget
        if key is not None and self.budget is not None:
            out.append(f"{key}={self.budget}")
        return out


def grid(methods: list[str], budgets: list[float], seeds: list[int],
         time_budgets: list[float] = ()) -> list[RunSpec]:
    """Every (method, budget, seed); budget-free methods once per seed; every method a time
    budget can plan (time_budgeted) once more per time budget. Seed-major order so an
    interrupted grid still holds whole seeds."""
    return [
        spec
        for s in seeds
        for m in methods
        for spec in ([RunSpec(m, b, s) for b in ([None] if METHODS[m].budget is None else budgets)]
                     + [RunSpec(m, None, s, tb) for tb in time_budgets if time_budgeted(m, tb)])
    ]
