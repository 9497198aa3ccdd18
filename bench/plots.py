"""PNG figures of an HTTP replay result (`bench.http_replay.run_bench`), matplotlib Agg backend.

- `ttft_ccdf.png`: TTFT CCDF per policy and prompt mode, log y (as the paper's figure); one panel
  per QPS;
- `ttft_vs_qps.png`: TTFT p50/p95/p99 against QPS per policy and mode (when there are several QPS);
- `kv_sessions.png`: KV blocks used and admitted sessions over each cell's time;
- `replicas.png`: replica count over time (when the replica count changed: autoscaling).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend is chosen first)

from bench.http_replay import ccdf  # noqa: E402

PERCENTILES = (("ttft_p50_s", "p50", "-"), ("ttft_p95_s", "p95", "--"), ("ttft_p99_s", "p99", ":"))


def load_label(cell: dict) -> str:
    """"QPS 0.2" (open loop) or "4 clients" (closed loop)."""
    return f"{cell['clients']} clients" if cell.get("clients") else f"QPS {cell['qps']:g}"


def cell_label(cell: dict, with_qps: bool = False) -> str:
    label = f"{cell['policy']} {cell['mode']}"
    return f"{label} @{load_label(cell)}" if with_qps else label


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_ccdf(result: dict, path: Path) -> Path:
    qps_values = sorted({c["qps"] for c in result["cells"]})
    fig, axes = plt.subplots(1, len(qps_values), figsize=(5.5 * len(qps_values), 4), squeeze=False)
    for ax, qps in zip(axes[0], qps_values):
        cells = [c for c in result["cells"] if c["qps"] == qps]
        for cell in cells:
            ttft = [r["ttft_s"] for r in result["requests"] if r["ok"] and _same_cell(r, cell)]
            if ttft:
                xs, ys = ccdf(ttft)
                ax.step(xs, ys, where="post", label=cell_label(cell))
        ax.set(yscale="log", xlabel="TTFT (s, client side)", ylabel="P(TTFT >= x)", title=load_label(cells[0]))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def _same_cell(request: dict, cell: dict) -> bool:
    return all(request[k] == cell[k] for k in ("policy", "mode", "qps"))


def plot_percentiles(result: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    groups = sorted({(c["policy"], c["mode"]) for c in result["cells"]})
    for i, (policy, mode) in enumerate(groups):
        cells = sorted((c for c in result["cells"] if (c["policy"], c["mode"]) == (policy, mode)),
                       key=lambda c: c["qps"])
        for key, name, style in PERCENTILES:
            points = [(c["qps"], c[key]) for c in cells if c[key] is not None]
            if points:
                ax.plot(*zip(*points), style, marker="o", color=f"C{i}", label=f"{policy} {mode} {name}")
    ax.set(yscale="log", xlabel="QPS", ylabel="TTFT (s)", title="TTFT percentiles vs QPS")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_kv_sessions(result: dict, path: Path) -> Path:
    fig, (kv_ax, s_ax) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for cell in result["cells"]:
        series = cell["series"]
        t = [s["t_s"] for s in series]
        kv_ax.plot(t, [s["kv_blocks_used"] / max(1, s["kv_blocks_total"]) for s in series],
                   label=cell_label(cell, True))
        s_ax.plot(t, [s["sessions"] for s in series], label=cell_label(cell, True))
    kv_ax.set(ylabel="KV blocks used (fraction)", title="KV usage and admitted sessions")
    s_ax.set(xlabel="time since cell start (s)", ylabel="sessions")
    for ax in (kv_ax, s_ax):
        ax.grid(True, alpha=0.3)
    kv_ax.legend(fontsize=7)
    return _save(fig, path)


def plot_replicas(result: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3))
    for cell in result["cells"]:
        series = cell["series"]
        ax.step([s["t_s"] for s in series], [s["replicas"] for s in series], where="post",
                label=cell_label(cell, True))
    ax.set(xlabel="time since cell start (s)", ylabel="replicas", title="Replicas over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def autoscaled(result: dict) -> bool:
    """Autoscaling was configured (max > min replicas) or the replica count changed."""
    replicas = result.get("config", {}).get("app", {}).get("replicas", {})
    counts = {s["replicas"] for c in result["cells"] for s in c["series"]}
    return replicas.get("max_replicas", 1) > replicas.get("min_replicas", 1) or len(counts) > 1


def plot_all(result: dict, folder: Path, prefix: str = "") -> list[Path]:
    """Every figure that applies to `result`; the written paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [plot_ccdf(result, folder / f"{prefix}ttft_ccdf.png"),
             plot_kv_sessions(result, folder / f"{prefix}kv_sessions.png")]
    if len({c["qps"] for c in result["cells"]}) > 1:
        paths.append(plot_percentiles(result, folder / f"{prefix}ttft_vs_qps.png"))
    if autoscaled(result):
        paths.append(plot_replicas(result, folder / f"{prefix}replicas.png"))
    return paths
