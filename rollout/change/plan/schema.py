"""The plan file, parsed once: what to change (the kubelet fragment), where (distribution, method,
per-node overrides), and every section the rest of the tool reads (strategy, windows, gate, the
allocation path's section), each as a typed value.

Why one parse: a plan is the operator's input, and a bad value must stop every command the same
way, before anything reads a cluster or a node, with the file, the field and its line
(``Plan.location``). The sections' parsers stay with the values they build
(:func:`rollout.change.plan.strategy.parse_strategy`,
:func:`rollout.change.plan.windows.parse_windows`,
:func:`rollout.change.plan.gate_section.parse_gate_config`,
:func:`rollout.change.plan.allocation_path_section.parse_path_plan`); only :func:`parse_plan` calls
them (``tests/unit/test_plan_typed.py`` holds that). The kubelet intent is per node (its overrides,
its facts): :meth:`Plan.intent_for` builds it from the plan with the plan's lines.

A new kind of change adds its own section here: a top-level key in ``TOP_LEVEL``, a field on
``Plan`` holding its typed value (None: the plan has none) and one call of the kind's parser in
:func:`parse_plan`, as ``allocationPath`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from rollout.change.plan.allocation_path_section import PathPlan, parse_path_plan
from rollout.change.plan.gate_section import GateConfig, parse_gate_config
from rollout.change.plan.strategy import Strategy, parse_strategy
from rollout.change.plan.windows import Window, parse_windows
from rollout.change.record.entries import ChangeBegin
from rollout.errors import InputError, Location, read_input, suggest
from rollout.kubelet.distributions import DISTRIBUTIONS
from rollout.kubelet.documents import parse_document
from rollout.kubelet.intent import Intent, build_intent

API_VERSION = "rollout.dev/v1alpha1"
KIND = "RolloutPlan"
TOP_LEVEL = (
    "apiVersion",
    "kind",
    "metadata",
    "distribution",
    "method",
    "kubelet",
    "nodes",
    "strategy",
    "gate",
    "windows",
    "allocationPath",
    "tenancy",
    "stages",
)
NODE_KEYS = ("kubelet", "distribution", "method")
STAGE_KEYS = ("name", "kubelet")


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged key-wise on top of ``base`` (a nested mapping merged one level down)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class Stage:
    """One stage of a staged plan: a name and the kubelet fragment merged over the plan's.

    Each stage is a change of its own (canaried, gated, promoted); the next one starts only when
    the previous one was promoted and its benchmark allowed tightening
    (:mod:`rollout.change.commands.stages`, docs/plan-file.md)."""

    name: str
    kubelet: Mapping[str, Any]


@dataclass(frozen=True)
class NodeOverride:
    """Per-node values that replace the plan's (the kubelet fragment is merged over the plan's)."""

    kubelet: Mapping[str, Any] = field(default_factory=dict)
    distribution: str | None = None
    method: str | None = None


@dataclass(frozen=True)
class Plan:
    """A parsed plan file.

    Attributes:
        path: the file, for messages.
        name: ``metadata.name``.
        distribution, method: defaults for every node (None: from node facts / per distribution).
        kubelet: the KubeletConfiguration fragment (the intent).
        nodes: per-host overrides, by inventory hostname.
        strategy: the ``strategy`` section (defaults when the plan has none); a percentage
            ``maxUnavailable`` is resolved by ``Strategy.for_nodes``.
        gate: the ``gate`` section (an empty one: the gate's defaults); None: the plan has no
            gate (``apply`` then runs none).
        windows: the ``windows`` (empty: always open).
        lines: 1-based line of each dotted field.
        allocation_path: the ``allocationPath`` section (the allocation-path change's); None:
            the plan has none (or an empty one).
        tenancy: the pool's tenancy file (``rollout tenancy``), relative paths resolved
            against the plan's directory; None when the plan names none.
        stages: the plan's ``stages:`` (empty: one change, the plan's kubelet).
        stage: the stage this plan value is (:meth:`at_stage`: its kubelet already merged in),
            None when no stage was chosen.
    """

    path: str
    name: str
    distribution: str | None
    method: str | None
    kubelet: Mapping[str, Any]
    nodes: Mapping[str, NodeOverride]
    strategy: Strategy
    gate: GateConfig | None
    windows: tuple[Window, ...]
    lines: Mapping[str, int]
    allocation_path: PathPlan | None = None
    tenancy: str | None = None
    stages: tuple[Stage, ...] = ()
    stage: int | None = None

    def at_stage(self, index: int) -> Plan:
        """The plan as stage ``index`` (0-based) changes nodes: the stage's kubelet fragment
        merged over the plan's (the per-node overrides still merge on top).

        Raises:
            InputError: the plan has no such stage (a change recorded with a stage the file no
                longer has).
        """
        if not 0 <= index < len(self.stages):
            raise InputError(
                f"the plan has no stage {index + 1} (it has {len(self.stages)})",
                self.location("stages"),
            )
        return replace(self, kubelet=_merged(self.kubelet, self.stages[index].kubelet), stage=index)

    def for_change(self, info: ChangeBegin) -> Plan:
        """The plan as the change whose ``begin`` recorded ``info`` ran it: at its stage when it
        recorded one (``info.stage.index``), else as is."""
        if info.stage is not None and info.stage.index is not None:
            return self.at_stage(info.stage.index)
        return self

    @property
    def has_gate(self) -> bool:
        """Whether the plan has a ``gate:`` section (an empty one too: the gate's defaults)."""
        return self.gate is not None

    def line_of(self, dotted_field: str) -> int | None:
        """The line of ``dotted_field`` (``strategy.maxUnavailable``, ``windows[0].start``), or of
        the nearest enclosing field that has one."""
        return _line_of(self.lines, dotted_field)

    def location(self, dotted_field: str) -> Location:
        return Location(file=self.path, field=dotted_field, line=self.line_of(dotted_field))

    def kubelet_for(self, host: str | None) -> dict[str, Any]:
        """The fragment for one node: the plan's, with the node's override merged key-wise on
        top."""
        if host is not None and host in self.nodes:
            return _merged(self.kubelet, self.nodes[host].kubelet)
        return dict(self.kubelet)

    def intent_for(
        self,
        host: str | None,
        *,
        existing_reservation: bool = False,
        flags: Mapping[str, Any] | None = None,
        sets: Iterable[tuple[str, Any]] = (),
    ) -> Intent:
        """The kubelet intent for one node (``host``; None: the plan's own fragment): its
        fragment (:meth:`kubelet_for`) over the defaults, then ``flags`` and ``sets``
        (``rollout kubelet render``), a bad value named by the plan's file, field and line.

        Raises:
            InputError: as :func:`rollout.kubelet.intent.build_intent`.
        """
        return build_intent(
            self.kubelet_for(host),
            flags=flags,
            sets=sets,
            plan_file=self.path,
            plan_lines=self.lines,
            existing_reservation=existing_reservation,
        )

    def distribution_for(self, host: str | None) -> str | None:
        o = self.nodes.get(host) if host is not None else None
        return (o.distribution if o and o.distribution else None) or self.distribution

    def method_for(self, host: str | None) -> str | None:
        o = self.nodes.get(host) if host is not None else None
        return (o.method if o and o.method else None) or self.method


def _mapping(value: Any, name: str, path: str, lines: Mapping[str, int]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(
            f"must be a mapping, got {type(value).__name__}",
            Location(file=path, field=name, line=lines.get(name)),
        )
    return value


def parse_plan(text: str, path: str) -> Plan:
    """Parse plan text. See ``load_plan``."""
    doc = parse_document(text, path, "yaml")
    data, lines = doc.data, doc.lines

    def loc(f: str) -> Location:
        return Location(file=path, field=f, line=lines.get(f))

    for key in data:
        if key not in TOP_LEVEL:
            raise InputError(f"unknown field{suggest(str(key), TOP_LEVEL)}", loc(str(key)))
    if data.get("apiVersion", API_VERSION) != API_VERSION:
        raise InputError(f"apiVersion must be {API_VERSION!r}", loc("apiVersion"))
    if data.get("kind", KIND) != KIND:
        raise InputError(f"kind must be {KIND!r}", loc("kind"))
    metadata = _mapping(data.get("metadata"), "metadata", path, lines)
    name = str(metadata.get("name") or Path(path).stem)
    dist = data.get("distribution")
    if dist is not None and dist not in DISTRIBUTIONS:
        raise InputError(
            f"unknown distribution {dist!r}{suggest(str(dist), DISTRIBUTIONS)}; "
            f"valid: {', '.join(sorted(DISTRIBUTIONS))}",
            loc("distribution"),
        )
    method = data.get("method")
    if method is not None and not isinstance(method, str):
        raise InputError("must be a string", loc("method"))
    kubelet = _mapping(data.get("kubelet"), "kubelet", path, lines)
    nodes_raw = _mapping(data.get("nodes"), "nodes", path, lines)
    nodes: dict[str, NodeOverride] = {}
    for host, override in nodes_raw.items():
        o = _mapping(override, f"nodes.{host}", path, lines)
        for k in o:
            if k not in NODE_KEYS:
                raise InputError(
                    f"unknown field{suggest(str(k), NODE_KEYS)}", loc(f"nodes.{host}.{k}")
                )
        nd = o.get("distribution")
        if nd is not None and nd not in DISTRIBUTIONS:
            raise InputError(
                f"unknown distribution {nd!r}{suggest(str(nd), DISTRIBUTIONS)}",
                loc(f"nodes.{host}.distribution"),
            )
        nodes[str(host)] = NodeOverride(
            kubelet=_mapping(o.get("kubelet"), f"nodes.{host}.kubelet", path, lines),
            distribution=nd,
            method=o.get("method"),
        )
    windows = data.get("windows") or []
    if not isinstance(windows, list):
        raise InputError("must be a list", loc("windows"))
    location = partial(_location, path, lines)
    line_of = partial(_line_of, lines)
    tenancy = data.get("tenancy")
    if tenancy is not None and (not isinstance(tenancy, str) or not tenancy):
        raise InputError("must be the path of a tenancy file", loc("tenancy"))
    stages = _stages(data.get("stages"), path, lines)
    strategy = parse_strategy(_mapping(data.get("strategy"), "strategy", path, lines), location)
    gate = None
    if "gate" in data:  # an empty gate: the gate's defaults
        raw_gate = _mapping(data["gate"], "gate", path, lines) or None
        gate = parse_gate_config(raw_gate, file=path, line_of=line_of)
    if len(stages) > 1 and (gate is None or gate.bench is None):
        raise InputError(
            "a plan with more than one stage needs gate.bench: the next stage starts only when "
            "the previous one's benchmark allows tightening (docs/plan-file.md)",
            location("stages"),
        )
    return Plan(
        path=path,
        name=name,
        distribution=dist,
        method=method,
        kubelet=kubelet,
        nodes=nodes,
        strategy=strategy,
        gate=gate,
        windows=parse_windows(windows, file=path, line_of=line_of),
        lines=lines,
        allocation_path=_allocation_path(data.get("allocationPath"), path, lines, location),
        tenancy=str(Path(path).parent / tenancy) if tenancy else None,
        stages=stages,
    )


def _line_of(lines: Mapping[str, int], dotted_field: str) -> int | None:
    """The line of ``dotted_field``, or of the nearest enclosing field that has one."""
    f = dotted_field
    while f:
        if f in lines:
            return lines[f]
        cut = max(f.rfind("."), f.rfind("["))
        f = f[:cut] if cut > 0 else ""
    return None


def _location(path: str, lines: Mapping[str, int], dotted_field: str) -> Location:
    return Location(file=path, field=dotted_field, line=_line_of(lines, dotted_field))


def _allocation_path(
    raw: Any, path: str, lines: Mapping[str, int], location: Callable[[str], Location]
) -> PathPlan | None:
    """The ``allocationPath`` section, parsed by its kind (None when absent or empty)."""
    section = _mapping(raw, "allocationPath", path, lines)
    if not section:
        return None
    return parse_path_plan(section, location)


def _stages(raw: Any, path: str, lines: Mapping[str, int]) -> tuple[Stage, ...]:
    """``stages:``: a list of ``{name, kubelet}``, names unique."""

    def loc(f: str) -> Location:  # a missing field: the line of the stage that lacks it
        line, up = lines.get(f), f
        while line is None and ("." in up or "[" in up):
            up = up[: max(up.rfind("."), up.rfind("["))]
            line = lines.get(up)
        return Location(file=path, field=f, line=line)

    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise InputError("must be a non-empty list of stages (name, kubelet)", loc("stages"))
    out: list[Stage] = []
    for i, item in enumerate(raw):
        where = f"stages[{i}]"
        st = _mapping(item, where, path, lines)
        for k in st:
            if k not in STAGE_KEYS:
                raise InputError(f"unknown field{suggest(str(k), STAGE_KEYS)}", loc(f"{where}.{k}"))
        name = st.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InputError("every stage needs a name", loc(f"{where}.name"))
        if any(s.name == name for s in out):
            raise InputError(f"stage name {name!r} is used twice", loc(f"{where}.name"))
        kubelet = _mapping(st.get("kubelet"), f"{where}.kubelet", path, lines)
        if not kubelet:
            raise InputError("a stage changes something: give its kubelet fragment", loc(where))
        out.append(Stage(name=name, kubelet=kubelet))
    return tuple(out)


def load_plan(path: Path | str) -> Plan:
    """Read and parse a plan file.

    Raises:
        InputError: missing file, unknown top-level field (with a suggestion), wrong types.
        ParseError: malformed YAML.
    """
    p = Path(path)
    text = read_input(p)
    return parse_plan(text, str(p))


def recorded_plan(info: ChangeBegin, change_id: str) -> Plan | None:
    """The plan a change started with: its file when it is still there, else the text the change
    recorded (``planText`` in the journal's change entry, and so in the cluster record): a
    machine that never had the file resumes, rolls back by group and serves alerts with the
    same plan. None when neither is at hand (a change recorded before ``planText``).

    Raises:
        InputError, ParseError: the file is there but no longer parses.
    """
    path = info.plan
    if path and Path(path).is_file():
        return load_plan(path).for_change(info)
    text = info.plan_text
    if text is None:
        return None
    return parse_plan(text, f"{path or 'plan'} (as recorded in change {change_id})").for_change(
        info
    )
