"""Planner cores: pure policy (plain inputs in, decisions out, time passed in). No I/O, no bus, no torch.

- pool assignment (`PoolAssigner`): large or volatile models to the elastic pool, back with hysteresis;
- steady planner (`SteadyPlanner`): Phi bin packing, local repack, consolidation, optional exact MILP;
- overflow watch (`OverflowWatch`): a steady model whose requests queue gets an early steady plan;
- elastic scaler (`ElasticScaler`): m* by binary search on the Elasticity predictions, keep-alive, budget in devices
  (`elastic_budget_devices`), debounce;
- reconciler (`Reconciler`): plans vs registry and heartbeats -> lifecycle commands, retries, reports.
"""
from .fleet_state import DecodeKV, decode_kv_by_model, elastic_budget_devices, elastic_models_of, in_flight_by_model
from .fleet_state import reported
from .fleet_state import steady_worker_order
from .commands import PlanStatus, ReconcileEffects
from .elastic import ElasticDecision, ElasticScaler, fit_to_budget, plan_decision, split_prefill_decode
from .elastic import unpadded_counts
from .exact import ExactResult, solve_exact
from .overflow import OverflowWatch
from .greedy import lower_bound, pack_ffd, pack_phi
from .oracle_port import OracleAnswerError, OracleLike
from .packing import Packing, phi
from contracts.load_book import LoadBook, merge_windows
from .policy import ElasticPolicy, PlannerPolicy, PoolPolicy, ReconcilerPolicy, SteadyPolicy
from .pool_assignment import PoolAssigner, PoolVerdict
from .reconciler import Reconciler
from .replica_search import ReplicaSearch, search_min_replicas
from .rounding import largest_remainder, scale_to_budget
from .steady import SteadyDecision, SteadyPlanner

__all__ = [
    "ElasticDecision", "ElasticPolicy", "LoadBook", "PlannerPolicy", "merge_windows", "ElasticScaler", "ExactResult", "OracleAnswerError", "OracleLike", "OverflowWatch", "Packing",
    "PlanStatus", "PoolAssigner", "PoolPolicy", "PoolVerdict", "ReconcileEffects", "Reconciler", "ReconcilerPolicy",
    "ReplicaSearch", "SteadyDecision", "SteadyPlanner", "SteadyPolicy", "largest_remainder", "lower_bound", "pack_ffd",
    "pack_phi", "phi", "scale_to_budget", "search_min_replicas", "solve_exact", "split_prefill_decode",
    "unpadded_counts", "elastic_budget_devices", "elastic_models_of", "in_flight_by_model", "reported", "steady_worker_order", "fit_to_budget", "plan_decision",
    "DecodeKV", "decode_kv_by_model",
]
