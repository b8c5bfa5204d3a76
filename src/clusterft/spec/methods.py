"""The selection methods, declared once: what each needs, how a budget maps onto it and how
its steps are planned. Config checks, selection, allocation, training, the experiment grid
and `compare` read this table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    needs: tuple[str, ...] = ()      # once-per-dataset selection stages whose time the method pays
    budget: str | None = "select.budget"  # the param a grid budget sets; None: no budget (all data)
    allocation: str = "plan"         # plan: balanced/shuffled static plan | rank_per_cluster (paper)
                                     # | infobatch: batches drawn per epoch during training
                                     # | dynamic: a balanced subset drawn per epoch from the pool


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("full", "all of train, weight 1 (the reference)", budget=None),
    Method("random", "a uniform random subset of the budget's size, weight 1"),
    Method("cluster", "clusterft: balanced per-cluster quotas, weighted update, DP-aware plan",
           needs=("warmup", "features", "cluster")),
    Method("cluster_dynamic", "clusterft per epoch: every cluster keeps its quota, the samples inside "
           "it rotate from epoch to epoch (without replacement until the cluster is used up)",
           needs=("warmup", "features", "cluster"), allocation="dynamic"),
    Method("cluster_paper", "the CluSTER paper's rules (ratio r = the budget; one rank per cluster)",
           needs=("warmup", "features"), budget="select.paper_ratio", allocation="rank_per_cluster"),
    Method("infobatch", "InfoBatch: prunes well-learned samples per epoch while training", budget=None,
           allocation="infobatch"),
)}


def method(name: str) -> Method:
    """The method named `name`; KeyError names the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(METHODS)}") from None


def time_budgeted(name: str, time_budget: float) -> bool:
    """True when select.time_budget sets this method's data budget (its budget is select.budget)."""
    return bool(time_budget) and METHODS[name].budget == "select.budget"


def paid_stages(name: str, time_budget: float = 0.0) -> tuple[str, ...]:
    """Once-per-dataset stages whose time the method's end-to-end time includes: what it
    needs, plus the training probe when a time budget plans its data budget."""
    return METHODS[name].needs + (("probe",) if time_budgeted(name, time_budget) else ())
