"""Result records of a benchmark run, and their JSON form.

Everything the reports show is computed from these records, so a saved JSON file
can be rendered again (``opforge bench --from-json results.json --markdown out.md``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from opforge.bench.spec import CPU, OPFORGE, shape_label

SCHEMA = "opforge-bench/1"

OK = "ok"
ABSENT = "absent"
WRONG = "wrong"
ERROR = "error"
SKIPPED = "skipped"


@dataclass
class ImplResult:
    """One implementation on one case.

    ``status`` is ``ok``, ``absent`` (cannot run here: not installed, no GPU, no such
    kernel), ``wrong`` (ran, but its output failed the float64 oracle: shown, never
    ranked), ``error`` (raised) or ``skipped`` (time budget). Times are microseconds per
    call: ``gpu_us`` is the median event-timed device time, ``wall_us`` the host wall
    time per call of a synchronized loop (in wall-time suites, the median over rounds that
    take every implementation in turn, so host noise falls on all alike). ``first_call_s`` is the first call's wall
    time (compilation included); ``compile_s`` repeats it for torch.compile.
    """

    impl: str
    status: str = OK
    reason: str | None = None
    gpu_us: float | None = None
    gpu_us_p20: float | None = None
    gpu_us_p80: float | None = None
    wall_us: float | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    first_call_s: float | None = None
    compile_s: float | None = None
    rel_err: float | None = None
    tol: float | None = None
    backend: str | None = None
    reps: int | None = None
    calls: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class CaseResult:
    """All implementations of one (op, shape, dtype) within a suite."""

    suite: str
    op: str
    shape: list[int]
    dtype: str
    bytes: int
    buffers: int = 1
    results: dict[str, ImplResult] = field(default_factory=dict)
    #: opforge's speedup over each correct peer under the suite's metric (the CPU: wall time).
    speedups: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.op} {shape_label(self.shape)} {self.dtype}"

    def time(self, impl: str, metric: str) -> float | None:
        """The impl's time under ``metric`` if it ran correctly, else None.

        The CPU implementation has no device timer: its wall time stands in.
        """
        r = self.results.get(impl)
        if r is None or not r.ok:
            return None
        if impl == CPU:
            return r.wall_us
        return getattr(r, metric)

    def best_peer(self, metric: str) -> tuple[str, float] | None:
        """Fastest correct peer on the device (opforge and the CPU excluded)."""
        best: tuple[str, float] | None = None
        for name in self.results:
            if name in (OPFORGE, CPU):
                continue
            t = self.time(name, metric)
            if t is not None and (best is None or t < best[1]):
                best = (name, t)
        return best

    def speedup(self, peer: str, metric: str) -> float | None:
        """``time(peer) / time(opforge)``: above 1 means opforge is faster."""
        mine, theirs = self.time(OPFORGE, metric), self.time(peer, metric)
        if mine is None or theirs is None or mine <= 0:
            return None
        return theirs / mine

    def fill_speedups(self, metric: str) -> None:
        """Compute :attr:`speedups` from the results (the runner calls it once per case)."""
        self.speedups = {}
        for name in self.results:
            if name == OPFORGE:
                continue
            sp = self.speedup_vs_cpu() if name == CPU else self.speedup(name, metric)
            if sp is not None:
                self.speedups[name] = sp

    def speedup_vs_cpu(self) -> float | None:
        """CPU wall time over opforge's wall time (the users' GPU-vs-CPU column)."""
        mine = self.time(OPFORGE, "wall_us")
        cpu = self.time(CPU, "wall_us")
        if mine is None or cpu is None or mine <= 0:
            return None
        return cpu / mine


@dataclass
class ChainResult:
    """A chain of ``length`` calls of one op, eager vs replayed from a CUDA graph."""

    op: str
    shape: list[int]
    dtype: str
    impl: str
    length: int
    status: str = OK
    reason: str | None = None
    eager_us: float | None = None
    graph_us: float | None = None
    graph_status: str = OK
    graph_reason: str | None = None
    graph_rel_err: float | None = None

    @property
    def graph_speedup(self) -> float | None:
        if self.eager_us is None or self.graph_us is None or self.graph_us <= 0:
            return None
        return self.eager_us / self.graph_us


@dataclass
class TargetResult:
    """One target judged on one case."""

    target: str
    case: str
    met: bool
    detail: str


@dataclass
class SuiteResult:
    name: str
    description: str
    metric: str
    impls: list[str]
    cases: list[CaseResult] = field(default_factory=list)
    chains: list[ChainResult] = field(default_factory=list)
    targets: list[TargetResult] = field(default_factory=list)
    seconds: float | None = None


@dataclass
class RunResult:
    """A whole run: environment, copy bandwidth, and each suite's results."""

    meta: dict[str, Any]
    copy_gbps: float | None
    suites: list[SuiteResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON. Example: ``json.dumps(run.to_dict())``."""
        return {"schema": SCHEMA, **asdict(self)}

    def save_json(self, path: str | Path) -> None:
        """Write the run as indented JSON. Example: ``run.save_json("results.json")``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        """Inverse of :meth:`to_dict`. Example: ``RunResult.from_dict(json.load(f))``."""
        suites = []
        for s in data.get("suites", []):
            cases = [
                CaseResult(
                    **{
                        **_pick(CaseResult, c),
                        "results": {k: ImplResult(**_pick(ImplResult, v)) for k, v in c["results"].items()},
                    }
                )
                for c in s.get("cases", [])
            ]
            chains = [ChainResult(**_pick(ChainResult, c)) for c in s.get("chains", [])]
            targets = [TargetResult(**_pick(TargetResult, t)) for t in s.get("targets", [])]
            base = _pick(SuiteResult, s)
            base.update(cases=cases, chains=chains, targets=targets)
            suites.append(SuiteResult(**base))
        return cls(meta=data.get("meta", {}), copy_gbps=data.get("copy_gbps"), suites=suites)

    @classmethod
    def load_json(cls, path: str | Path) -> "RunResult":
        """Read a file written by :meth:`save_json`. Example: ``RunResult.load_json(p)``."""
        return cls.from_dict(json.loads(Path(path).read_text()))


def _pick(kind: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in data.items() if k in names}


def write_report(result: dict[str, Any], text: str, json_path: str | None, markdown_path: str | None) -> None:
    """Print a whole-run suite's Markdown ``text`` and write ``result`` as JSON and ``text`` as
    Markdown where asked (the ``--json`` / ``--markdown`` of the suites that are not case grids).

    Example:
        >>> write_report({"rows": []}, "no rows", None, None)
        no rows
    """
    print(text)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(text)
