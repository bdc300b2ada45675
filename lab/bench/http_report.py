"""The HTTP benchmark's markdown table (from its JSON report)."""

from __future__ import annotations

from typing import Any

FLOOR_PHASE = "health"  # the phase of GET /health at c=1 in each round: what any HTTP answer costs here


def floors_by_round(phases: list[dict[str, Any]]) -> dict[int, float]:
    """{round: GET /health p50 ms} of the HTTP-floor phases that answered."""
    return {ph["round_no"]: ph["p50_ms"] for ph in phases if ph["name"] == FLOOR_PHASE and ph["p50_ms"] is not None}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"HTTP benchmark — model `{report['model_dir']}`, data: {report['data']}, {report['machine']['cpus']} CPUs"
        + (" (SMOKE: no timing meaning)" if report["smoke"] else ""),
        "",
    ]
    runtime = report.get("runtime")
    if runtime:
        lines += [
            f"Runtime reference ({runtime['model']}, {runtime['variant']}, {runtime['provider']}): "
            f"single p50 {runtime['single_p50_ms']} ms, "
            f"batched ({runtime['batch_size']}) {runtime['batched_items_per_s']} items/s"
            + (f" (medians of {runtime['rounds']} rounds)" if runtime.get("rounds", 1) > 1 else ""),
            "",
        ]
        lines += _rounds(report)
    lines += [
        "| phase | round | concurrency | requests | errors | 429 | p50 ms | p95 ms | p99 ms | req/s | items/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = list(report.get("service", []))
    overload = report.get("overload")
    if overload:
        rows += [overload["phase"], overload["recovery"]]
    if report.get("naive"):
        rows.append(report["naive"])
    for ph in rows:
        lines.append(
            f"| {ph['name']} | {ph.get('round_no') or ''} | {ph['concurrency']} | {ph['requests']} | {ph['errors']} | "
            f"{ph['status_counts'].get('429', 0)} | {ph['p50_ms']} | {ph['p95_ms']} | {ph['p99_ms']} | "
            f"{ph['throughput_rps']} | {ph['items_per_s']} |"
        )
    if overload:
        lines += [
            "",
            f"Overload: max_pending_tokens {overload['max_pending_tokens']}, concurrency {overload['concurrency']}: "
            f"{overload['rejected_429']} x 429 (p50 {overload['phase']['rejected_p50_ms']} ms, p99 "
            f"{overload['phase']['rejected_p99_ms']} ms); RSS {overload['rss_before_mib']} -> peak "
            f"{overload['rss_peak_mib']} -> {overload['rss_after_mib']} MiB (bounded: {overload['rss_bounded']}); "
            f"recovered: {overload['recovered']}",
        ]
    if report.get("naive_note"):
        lines += ["", f"Naive baseline {report['naive_note']}"]
    if report.get("targets"):
        lines += ["", "| target | value | limit | met | rounds |", "|---|---:|---:|---|---|"]
        for name, t in report["targets"].items():
            met = t.get("met", t.get("note", ""))
            rounds = ", ".join(str(v) for v in t.get("rounds", []))
            lines.append(f"| {name} | {t.get('value', '')} | {t.get('limit', '')} | {met} | {rounds} |")
    return "\n".join(lines)


def _rounds(report: dict[str, Any]) -> list[str]:
    """The runtime and the service round by round (measured in turns): the pairs each target compares."""
    classify = [ph for ph in report.get("service", []) if ph["name"] == "classify"]
    levels = sorted({ph["concurrency"] for ph in classify})
    if not levels:
        return []
    top = levels[-1]
    floors = floors_by_round(report.get("service", []))
    lines = [
        f"| round | runtime single p50 ms | after a gap | c=1 p50 ms | c=1 over runtime ms | GET /health p50 ms "
        f"| runtime batched items/s | c={top} items/s | c={top} / runtime |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report.get("runtime_rounds", []):
        at = {ph["concurrency"]: ph for ph in classify if ph["round_no"] == r["round_no"]}
        c1, high = at.get(1), at.get(top)
        over = f"{c1['p50_ms'] - r['single_p50_ms']:+.3f}" if c1 and c1["p50_ms"] is not None else ""
        ratio = f"{high['items_per_s'] / r['batched_items_per_s']:.3f}" if high and r["batched_items_per_s"] else ""
        lines.append(
            f"| {r['round_no']} | {r['single_p50_ms']} | {r.get('single_after_gap_p50_ms') or ''} "
            f"| {c1['p50_ms'] if c1 else ''} | {over} "
            f"| {floors.get(r['round_no']) or ''} | {r['batched_items_per_s']} | {high['items_per_s'] if high else ''} "
            f"| {ratio} |"
        )
    return lines + [""]
