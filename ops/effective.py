"""The effective configuration: a cluster YAML (or the defaults) with every policy knob expanded to the value that runs.

One source of defaults: `effective_policies(cluster)` builds the planner, dispatcher and oracle policies exactly as the
services do (`PlannerPolicy(**cluster.planner)`, `DispatchPolicy(**cluster.dispatcher)`,
`OraclePolicy.from_knobs(cluster.oracle)`) and dumps them as JSON-ready dicts, defaults included. `janus config`
prints it; the simulator records the same dict for the policies it ran with, so a live cluster and a simulated one
can be compared knob by knob.

Why here: the function needs the services' policy classes, and it must be callable from the CLI and from the
simulator. It cannot live in `planner/` or `dispatcher/` (the services are independent: neither may import the other),
nor in `runtime/` (the library every service imports sits below them). `ops/` sits above the services and below the
simulator (docs/architecture.md, "Layers"), so both callers reach it with arrows pointing down. The policy classes are
imported inside the function bodies, as `ops/cli.py` imports services, so importing `ops.effective` never loads a
service package (nor the planner core's packing and MILP modules).

`load_cluster` is the checked loader: every mistake in the YAML (missing file, bad YAML, a value out of range, an
unknown key, in the cluster or in a policy) is a `ConfigError` whose message is one line naming the file and the
YAML path and the offending value, e.g.
`cluster.yaml: planner.elastic.max_num_replicas: Input should be greater than or equal to 1 (got 0)`; a misspelt key
names the keys it may have meant (`workers.cont: Extra inputs are not permitted (did you mean 'count'?)`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.settings import ClusterConfig

__all__ = ["ConfigError", "effective_config", "effective_policies", "load_cluster"]


class ConfigError(ValueError):
    """A cluster configuration mistake; `str()` is one line naming the file and the YAML path."""


def effective_policies(cluster: ClusterConfig) -> dict[str, dict[str, Any]]:
    """The policies the services run with, every knob expanded: {"dispatcher": {...}, "planner": {...},
    "oracle": {...}}.

    JSON-ready (enums as their values). Raises pydantic's ValidationError on a bad knob; `load_cluster` turns that
    into a ConfigError with the YAML path."""
    from dataclasses import asdict

    from oracle.core.policy import OraclePolicy

    policies = {section: cls(**getattr(cluster, section)).model_dump(mode="json")
                for section, cls in _policy_classes().items()}
    return {**policies, "oracle": asdict(OraclePolicy.from_knobs(cluster.oracle))}


def _policy_classes() -> dict[str, type]:
    """ClusterConfig section -> the policy model its service builds from it (imported here, not at module top)."""
    from dispatcher.core.policy import DispatchPolicy
    from planner.core.policy import PlannerPolicy

    return {"dispatcher": DispatchPolicy, "planner": PlannerPolicy}


def effective_config(cluster: ClusterConfig, *, redact_secrets: bool = True) -> dict[str, Any]:
    """{"cluster": the ClusterConfig as JSON, "policy": effective_policies(cluster)}: what `janus config` prints.

    API keys are masked unless `redact_secrets` is False (the tenants they map to stay visible)."""
    data = cluster.model_dump(mode="json")
    if redact_secrets:
        keys = data["gateway"]["api_keys"]
        data["gateway"]["api_keys"] = {f"<redacted {i}>": tenant for i, tenant in enumerate(keys.values(), 1)}
    return {"cluster": data, "policy": effective_policies(cluster)}


def load_cluster(path: Path | None, *, check_policies: bool = True) -> ClusterConfig:
    """The cluster config of a YAML file (None: the defaults), validated, policies included.

    Raises ConfigError (one line: file, YAML path, what is wrong) on any mistake."""
    import yaml
    from pydantic import ValidationError

    where = str(path) if path is not None else "default cluster config"
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise ConfigError(f"{where}: not found") from None
        except OSError as e:
            raise ConfigError(f"{where}: cannot read: {e.strerror or e}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{where}: invalid YAML{_yaml_position(e)}: {_yaml_problem(e)}") from None
        if data is None:
            data = {}
    try:
        cluster = ClusterConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{where}: {_describe(e, root=ClusterConfig)}") from None
    if check_policies:
        for section, cls in _policy_classes().items():
            try:
                cls(**getattr(cluster, section))
            except ValidationError as e:
                raise ConfigError(f"{where}: {_describe(e, prefix=(section,), root=cls)}") from None
            except TypeError as e:  # a non-string key (e.g. `planner: {1: 2}`) cannot be a keyword argument
                raise ConfigError(f"{where}: {section}: {e}") from None
        from oracle.core.policy import OraclePolicy

        try:
            OraclePolicy.from_knobs(cluster.oracle)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{where}: oracle: {' '.join(str(e).split())}") from None
    return cluster


def _describe(error: Any, prefix: tuple = (), root: type | None = None) -> str:
    """Pydantic's errors as one line: `a.b[0].c: message (got VALUE); ...`; an unknown key of `root`'s tree also
    names the keys it may have meant."""
    parts = []
    for err in error.errors(include_url=False):
        loc = tuple(err.get("loc", ()))
        msg = " ".join(str(err.get("msg", "invalid")).split())
        if err.get("type") == "extra_forbidden":
            msg += _did_you_mean(root, loc)
        elif err.get("type") != "missing" and "input" in err:
            msg += f" (got {_short(err['input'])})"
        where = _dotted(prefix + loc)
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or " ".join(str(error).split())


_VALUE_MAX_CHARS = 60


def _short(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= _VALUE_MAX_CHARS else text[:_VALUE_MAX_CHARS - 3] + "..."


def _did_you_mean(root: type | None, loc: tuple) -> str:
    """` (did you mean 'count'?)` for a misspelt key, from the fields of the model at loc[:-1] under `root`."""
    import difflib
    import typing

    from pydantic import BaseModel

    model = root
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue  # a list element: the model found for the list's items stays
        field = model.model_fields.get(str(part))
        model = None
        if field is not None:
            candidates = [field.annotation, *typing.get_args(field.annotation)]
            model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if model is None or not loc:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _yaml_position(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _yaml_problem(e: Exception) -> str:
    problem = getattr(e, "problem", None) or str(e)
    return " ".join(str(problem).split())
