"""What the demo prints: each node's ResourceSlices, then per example its claims
(allocated devices, or gpudra's explanation), its pods and what their containers got.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.core.telemetry import tracing
from services.local.demoexamples import PENDING, RUNNING, Example
from services.local.demoview import ClaimView, DemoResult, PodView
from services.local.stack import Stack


def describe_slices(stack: Stack) -> list[str]:
    lines = ["ResourceSlices (driver gpu.nvidia.com):"]
    for name, node in stack.nodes.items():
        slices = stack.slices(name)
        kinds: dict[str, int] = {}
        for s in slices:
            for d in s["spec"].get("devices") or []:
                kind = (d.get("attributes") or {}).get("type", {}).get("string", "?")
                kinds[kind] = kinds.get(kind, 0) + 1
        detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        lines.append(
            f"  {name} ({node.spec.fleet}): {len(slices)} slice(s), "
            f"{sum(kinds.values())} devices ({detail})"
        )
    return lines


def describe_result(
    result: DemoResult,
    examples: Sequence[Example],
    trace_url: Callable[[str], str] | None = None,
) -> list[str]:
    """``trace_url``: where a trace id is shown (``gpudra up --jaeger``); each claim gets
    the URL of its trace."""
    lines: list[str] = []
    by_example: dict[str, list[PodView]] = {}
    for view in result.pods:
        by_example.setdefault(view.example, []).append(view)
    shown: set[str] = set()
    for example in examples:
        lines.append(f"{example.name}: {example.title}")
        for view in by_example.get(example.name, []):
            for claim in view.claims:
                key = f"{claim.namespace}/{claim.name}"
                if key in shown:
                    continue
                shown.add(key)
                lines.extend(_claim_lines(claim))
                if trace_url is not None:
                    lines.append(f"      trace: {trace_url(tracing.claim_trace_hex(claim.uid))}")
            lines.extend(_pod_lines(view))
    good, total = result.counts()
    running = sum(v.phase == RUNNING for v in result.pods)
    lines.append(f"{good}/{total} pods as expected ({running} Running) after {result.seconds:.1f}s")
    return lines


def _claim_lines(claim: ClaimView) -> list[str]:
    where = f"  claim {claim.namespace}/{claim.name}"
    if claim.devices:
        devices = ", ".join(f"{d.request}={d.pool}/{d.device}" for d in claim.devices)
        return [f"{where}: allocated {devices}"]
    if claim.explanation:
        text = claim.explanation.replace("\n", "\n      ")
        return [f"{where}: pending; gpudra explains:", f"      {text}"]
    return [f"{where}: not allocated"]


def _pod_lines(view: PodView) -> list[str]:
    pod = f"  pod {view.pod.namespace}/{view.pod.name}"
    if view.pod.expect == PENDING:
        verdict = "as expected" if view.ok else f"expected {PENDING} with an explanation"
        return [f"{pod}: {view.phase or 'absent'} ({verdict})"]
    if not view.ok:
        issue = "; ".join(view.problems) or "not prepared"
        return [f"{pod}: {view.phase or 'absent'} on {view.node or '-'} (FAILED: {issue})"]
    lines = [f"{pod}: Running on {view.node}"]
    for container, ids in sorted(view.cdi_devices.items()):
        lines.append(f"      {container}: {', '.join(ids) or '(no CDI devices)'}")
        for said in (view.logs.get(container) or "").splitlines():
            lines.append(f"        | {said}")
    return lines
