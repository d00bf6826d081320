"""What the decode benchmark's records say, computed from them for the results page.

``decode_law``: whether the records show what a fixed state promises (a flat time per token
against the context, attention's cache growing with it); ``decode_flat`` counts the same for
the sentence written by hand. ``decode_targets``: the decode steps against attention's at a
short context and against their physical limits at a large batch. ``decode_readings``: the
rest (matmul rate, cache-served reads, attention's slowest steps, page faults).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..report import markdown_table


def decode_targets(points: pd.DataFrame, short: int = 1024, small: tuple = (256, 1), large: tuple = (1024, 16),
                   fraction: float = 0.5) -> str:
    """Per fixed-state mixer, the two decode targets: at ``small`` (width, batch) and
    ``short`` tokens of context a token costs at most attention's (the ratio of the
    medians, or, where the point was also timed round by round against attention in one
    process, the median ratio of those rounds: noise minutes apart does not decide it); at
    ``large`` the step reaches ``fraction`` of its physical limit (the mean
    over the contexts measured). That limit is the tighter of two: reading the weights and
    the state at the measured bandwidth, or multiplying every weight with every sequence at
    the measured matmul rate; the step's fraction of it is the larger of its two fractions.
    Both are shown, and how many reach ``fraction`` of the bandwidth limit alone (where the
    arithmetic takes longer than twice the reads, none can). Fixed-state as in ``decode_law``."""
    def at(d, b):
        pts = points[(points["d_model"] == d) & (points["batch"] == b)]
        return {label: grp.set_index("context") for label, grp in pts.groupby("label")}

    lo, hi = at(*small), at(*large)
    att = lo.get("attention")
    if att is None or short not in att.index:
        return f"(no attention point at d {small[0]}, batch {small[1]}, context {short:,})"
    base = att.at[short, "ms_per_token"]
    lines, met, interleaved = [], [0, 0, 0], False
    for label, one in sorted(lo.items()):
        top = one.index.max()
        if label == "attention" or short not in one.index or one.at[short, "state_bytes"] != one.at[top, "state_bytes"]:
            continue
        ratio = one.at[short, "ms_per_token"] / base
        paired = one.at[short, "ratio_to_baseline"] if "ratio_to_baseline" in one else float("nan")
        if pd.notna(paired) and one.at[short, "baseline"] == "attention":  # timed side by side: it decides
            side = f"{paired:.2f}x [{one.at[short, 'ratio_low']:.2f}, {one.at[short, 'ratio_high']:.2f}]"
            ratio, interleaved = paired, True
        else:
            side = "–"
        cells = [label, f"{one.at[short, 'ms_per_token']:.3f} ms, {one.at[short, 'ms_per_token'] / base:.2f}x", side,
                 "yes" if ratio <= 1 else "no"]
        big = hi.get(label)
        if big is None:
            cells += ["–"] * 4
        else:
            bw = big["bandwidth_fraction"].mean()
            comp = big["compute_fraction"].mean() if "compute_fraction" in big and big["compute_fraction"].notna().any() else 0.0
            tight = max(bw, comp)
            cells += [f"{bw:.2f}", f"{comp:.2f}" if comp else "–", f"{tight:.2f}", "yes" if tight >= fraction else "no"]
            met[1] += bw >= fraction
            met[2] += tight >= fraction
        met[0] += ratio <= 1
        lines.append(cells)
    head = ["mixer", f"d {small[0]}, batch {small[1]}, {short:,} context: time, x attention's ({base:.3f} ms)",
            "x attention's, interleaved [lowest, highest round]", "at most attention's",
            f"d {large[0]:,}, batch {large[1]}: of the bandwidth limit",
            "of the arithmetic limit", "of the tighter limit", f">= {fraction}"]
    rule = (" (read from the interleaved ratio where there is one: the median over rounds timed side by side "
            "with attention in one process)") if interleaved else ""
    return (markdown_table(head, lines, ["---", "---:", "---:", "---", "---:", "---:", "---:", "---"]) +
            f"\n\n{met[0]} of {len(lines)} at most attention's{rule}; {met[2]} of {len(lines)} at {fraction} of "
            f"the tighter limit or more ({met[1]} of {len(lines)} at {fraction} of the bandwidth limit alone).")


def decode_readings(points: pd.DataFrame, large: tuple = (1024, 16), small: tuple = (1024, 1), short: int = 1024) -> str:
    """What the decode records say beyond the tables, as Markdown bullets, every number read
    from ``points`` (one row per point, with the run's ``matmul_gflop_s``): the matmul rate at
    ``large`` and the weight read rate it implies; whether one sequence's step at ``small``
    reads its weights from cache (bandwidth fractions above 1); attention's slowest step
    against its median and mean at ``large`` after ``short`` tokens, with its page faults,
    against the most any fixed-state step takes; and whether the mmap threshold took."""
    def at(d, b):
        return points[(points["d_model"] == d) & (points["batch"] == b)]

    big, one = at(*large), at(*small)
    if big.empty:
        return f"(no decode points at d {large[0]:,}, batch {large[1]})"
    rate = big.groupby("label")["matmul_gflop_s"].first()
    read = rate * 4 / (2 * large[1])  # GB/s of weights: 4 bytes a weight, 2 FLOPs a weight a sequence
    bandwidth = big.groupby("label")["bandwidth_gb_s"].first()
    bound = ("arithmetic, not memory, bounds such a step" if read.max() < bandwidth.min()
             else "memory, not arithmetic, bounds such a step")
    lines = [f"- At d {large[0]:,}, batch {large[1]} in float32 the (batch, d) x (d, 4d) product ran at "
             f"{rate.min():.0f} to {rate.max():.0f} GFLOP/s on one thread (`matmul_gflop_s`): it read its "
             f"weight at {read.min():.1f} to {read.max():.1f} GB/s, against {bandwidth.min():.0f} to "
             f"{bandwidth.max():.0f} GB/s that the bandwidth probe read (`bandwidth_gb_s`), so {bound}."]
    if not one.empty:
        cached = sorted(one.loc[one["bandwidth_fraction"] > 1, "label"].unique())
        lines.append(f"- At d {small[0]:,}, batch {small[1]}, {len(cached)} of {one['label'].nunique()} mixers read above "
                     "the bandwidth limit at some context (fractions above 1: weights or state served from cache)"
                     + (f": {', '.join(cached)}." if cached else "."))
    att = big[(big["label"] == "attention") & (big["context"] == short)]
    fixed = big[big["label"] != "attention"]
    fixed = fixed[(fixed.groupby("label")["state_bytes"].transform("nunique") == 1) & (fixed["context"] >= short)]
    if not att.empty and "max_ms" in att:
        r = att.iloc[0]
        worst = fixed["faults_per_token"].max() if not fixed.empty else float("nan")
        lines.append(f"- Attention's median hides its cache growing by a block every 64 tokens: after {short:,} "
                     f"tokens at d {large[0]:,}, batch {large[1]} its slowest step takes {r['max_ms']:.1f} ms against a "
                     f"median of {r['ms_per_token']:.1f} (mean {r['mean_ms_per_token']:.1f}), with "
                     f"{r['faults_per_token']:.0f} page faults a token; after {short:,} tokens or more the fixed-state "
                     f"steps take at most {worst:.2g} a token.")
    if "malloc_tuned" in points:
        tuned = points["malloc_tuned"].astype(str).str.lower().eq("true")
        lines.append(f"- glibc's mmap threshold was raised in {int(tuned.sum())} of {len(points)} points' processes "
                     "(`malloc_tuned`): a step's large temporaries keep their pages, as a long-running server's allocator would.")
    return "\n".join(lines)


def _flat_ratios(pts: pd.DataFrame, short: int) -> tuple[dict, dict, int]:
    """One setting's points: {fixed-state mixer: its time per token at the longest context
    over its time at ``short``}, every label's points by context, and the longest context."""
    by = {label: grp.set_index("context") for label, grp in pts.groupby("label")}
    top = int(pts["context"].max())
    ratios = {label: one.at[top, "ms_per_token"] / one.at[short, "ms_per_token"] for label, one in by.items()
              if short in one.index and top in one.index
              and one.at[short, "state_bytes"] == one.at[top, "state_bytes"]}
    return ratios, by, top


def decode_flat(points: pd.DataFrame, short: int = 1024, flat: float = 1.5) -> tuple[int, int, dict]:
    """Over every setting (width, batch): how many fixed-state mixer-settings keep their time
    per token within ``flat`` x from ``short`` to the longest context, of how many, and the
    others' ratios, {(d_model, batch, label): ratio} (the sentence the docs write by hand)."""
    within = total = 0
    others = {}
    for (d, b), pts in points.groupby(["d_model", "batch"]):
        ratios, _, _ = _flat_ratios(pts, short)
        total += len(ratios)
        within += sum(r <= flat for r in ratios.values())
        others.update({(int(d), int(b), label): r for label, r in ratios.items() if r > flat})
    return within, total, others


def decode_law(points: pd.DataFrame, short: int = 1024, flat: float = 1.5) -> str:
    """The decode benchmark against the law linear-time mixers are chosen for, per setting
    (width, batch), from the points that finished: a fixed-state mixer's time per token at
    the longest context within ``flat`` x its time at ``short``; the KV cache's bytes per
    sequence proportional to the context (attention's, against a straight line through
    the origin, within 2 %); and which mixers a token of attention's costs more than, at the
    longest context. A mixer is fixed-state when its state bytes do not change from
    ``short`` to the longest context (``state_size`` from the code, not a list of names)."""
    lines = []
    for (d, b), pts in points.groupby(["d_model", "batch"]):
        ratios, by, top = _flat_ratios(pts, short)
        fixed = list(ratios)
        flat_ok = [m for m in fixed if ratios[m] <= flat]
        verdict = [f"{len(flat_ok)} of {len(fixed)} fixed-state mixers within {flat}x" +
                   ("" if len(flat_ok) == len(fixed) else f" (not: {', '.join(sorted(set(fixed) - set(flat_ok)))})")]
        if "attention" in by:
            att = by["attention"]
            line = np.polyfit(att.index, att["state_mb_per_seq"], 1)  # the tokens the decode itself adds: the intercept
            off = (att["state_mb_per_seq"] - np.polyval(line, att.index)).abs().max()
            linear = bool(len(att) > 2 and line[0] > 0 and off <= 0.02 * att["state_mb_per_seq"].max())
            slower = [m for m in fixed if top in by["attention"].index
                      and by["attention"].at[top, "ms_per_token"] > by[m].at[top, "ms_per_token"]]
            verdict.append(f"attention's cache per sequence {'grows linearly' if linear else 'does not grow linearly'}"
                           f" with the context; at {top:,} its token costs more than that of {len(slower)} of "
                           f"the {len(fixed)}")
        lines.append([f"d {d}, batch {b}", "; ".join(verdict)])
    return markdown_table(["setting", f"from {short:,} to the longest context"], lines, ["---", "---"])
