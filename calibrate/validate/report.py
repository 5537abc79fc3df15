"""The validation report: a markdown page, a bar chart of predicted vs measured, and the traces side by side.

`write_report(result, folder)` writes, next to ``validation.json`` (the rows, written by `validate`):

    report.md                   the table, the headline accuracy, skipped rows with their reason, and per
                                variant the simulated timeline next to the real run's torch.profiler trace
    predicted_vs_measured.png   grouped bars per variant (matplotlib, headless)
    traces/                     <variant>.sim.json.gz (simulator) and <variant>.torch.rank<R>.json (PyTorch);
                                both open in Perfetto (ui.perfetto.dev) or chrome://tracing

`table_rows` / `rich_table` give the same table for the terminal.
"""

from __future__ import annotations

import io
from pathlib import Path

from trainsim.calibrate.measure.bundle import write_atomic
from trainsim.calibrate.validate.results import ValidationResult, ValidationRow

CHART = "predicted_vs_measured.png"
REPORT = "report.md"
# "x": speedup over the baseline variant; "x err pp": predicted minus measured speedup, in percentage points
COLUMNS = ("variant", "strategy", "ranks", "pred ms", "meas ms", "IQR ms", "err %", "pred x", "meas x",
           "x err pp", "status")


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x * 1e3:.2f}"


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def table_rows(result: ValidationResult) -> list[list[str]]:
    """One list of cells per variant, in COLUMNS order."""
    rows = []
    for r in result.rows:
        status = r.status + (" (baseline)" if r.variant == result.baseline else "")
        rows.append([r.variant, r.strategy, str(r.ranks), _ms(r.predicted_s), _ms(r.measured_s),
                     _ms(r.measured_iqr_s), _num(r.error_pct, "+.1f"), _num(r.predicted_speedup, ".3f"),
                     _num(r.measured_speedup, ".3f"), _num(r.speedup_error_pp, "+.1f"), status])
    return rows


def headline_lines(result: ValidationResult) -> list[str]:
    acc = result.accuracy()
    if not acc["compared"]:
        return ["no variant was both simulated and measured"]
    lines = [f"median |error| {acc['median_abs_error_pct']:.1f} % over {acc['compared']} variant(s); worst "
             f"{acc['worst_error_pct']:+.1f} % ({acc['worst_variant']})"]
    if acc["max_abs_speedup_error_pp"] is not None:
        wrong = acc["speedups_on_wrong_side"]
        side = f"on the wrong side of 1.0: {', '.join(wrong)}" if wrong else "all on the right side of 1.0"
        worst = acc["max_abs_speedup_error_pp"]
        lines.append(f"speedups over {result.baseline}: worst error {worst:.1f} pp; {side}")
    if acc["memory_compared"]:
        lines.append(f"peak memory per rank (simulated vs measured: {_measures(result)}): median |error| "
                     f"{acc['median_abs_memory_error_pct']:.1f} % over {acc['memory_compared']} variant(s); "
                     f"worst {acc['worst_memory_error_pct']:+.1f} % ({acc['worst_memory_variant']})")
    if acc["measured_round_spread_pct"] is not None:
        line = (f"the measurement against itself (median over the variants): a round's mean up to "
                f"{acc['measured_round_spread_pct']:.1f} % from the other rounds'")
        if acc["measured_speedup_range_pp"] is not None:
            line += f", a speedup {acc['measured_speedup_range_pp']:.1f} pp apart over the rounds"
        lines.append(line)
    return lines


def _measures(result: ValidationResult) -> str:
    measures = sorted({r.memory_measure for r in result.rows if r.memory_error_pct is not None})
    return ", ".join(m.replace("cuda.", "torch.cuda.") for m in measures)


def memory_lines(result: ValidationResult) -> list[str]:
    """One line per variant whose peak memory is compared: predicted and measured MiB (the largest rank's),
    how it was measured, and the error."""
    return [f"{r.variant}: peak memory predicted {r.predicted_peak_memory_bytes / 2**20:.1f} MiB, measured "
            f"{r.measured_peak_memory_bytes / 2**20:.1f} MiB ({r.memory_measure}), error "
            f"{r.memory_error_pct:+.1f} %" for r in result.rows if r.memory_error_pct is not None]


def reason_lines(result: ValidationResult) -> list[str]:
    return [f"{r.status} {r.variant}: {r.reason}" for r in result.rows if r.reason]


def rich_table(result: ValidationResult):
    from rich.table import Table

    table = Table(title=f"{result.scenario}: predicted (simulated from {result.calibration}) vs measured "
                        f"(this box), mean iteration time")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("variant", "strategy", "status") else "right")
    for cells in table_rows(result):
        table.add_row(*cells)
    return table


# ---------------------------------------------------------------- files


def write_chart(result: ValidationResult, path: Path) -> Path:
    """Grouped bars: predicted and measured iteration time per variant (rows not compared: labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.rows
    xs = range(len(rows))
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(rows) + 2), 4.2))
    pred = [(r.predicted_s or 0.0) * 1e3 for r in rows]
    meas = [(r.measured_s or 0.0) * 1e3 for r in rows]
    ax.bar([x - width / 2 for x in xs], pred, width, label="predicted (simulated)", color="#4c72b0")
    bars = ax.bar([x + width / 2 for x in xs], meas, width, label="measured (PyTorch)", color="#dd8452")
    if any(r.measured_iqr_s for r in rows):
        half_iqr = [(r.measured_iqr_s or 0.0) * 1e3 / 2 for r in rows]
        ax.errorbar([x + width / 2 for x in xs], meas, yerr=half_iqr,
                    fmt="none", ecolor="black", capsize=2, linewidth=0.8)
    top = max(pred + meas + [1e-9])
    for x, r, bar in zip(xs, rows, bars, strict=True):
        label = f"{r.error_pct:+.0f}%" if r.error_pct is not None else r.status
        ax.text(x, max(bar.get_height(), (r.predicted_s or 0.0) * 1e3) + 0.02 * top, label, ha="center",
                va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [r.variant for r in rows], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("iteration time (ms, mean)")
    ax.set_title(f"{result.scenario}: predicted vs measured")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())  # a symbolic link is written through, as every output
    return path


def _md_table(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def _link(path: str | None) -> str:
    return f"[{Path(path).name}]({path})" if path else "-"


def _breakdown(row: ValidationRow) -> str:
    pred = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in row.predicted_breakdown_s.items() if v > 0)
    meas = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in row.measured_breakdown_s.items() if v > 0)
    return f"simulated: {pred or '-'}; measured: {meas or '-'} (ms)"


def report_markdown(result: ValidationResult, *, chart: str | None = CHART) -> str:
    lines = [f"# trainsim validate: {result.scenario}", "",
             f"Predicted: simulated from the calibration bundle `{result.calibration}`. Measured: executed "
             f"with PyTorch on this box ({result.device}). Times are means over the iterations (the "
             "measured IQR is their spread); "
             "error = "
             f"(predicted - measured) / measured; speedup = {result.baseline}'s time / the variant's time; "
             "speedup error in percentage points = 100 x (predicted - measured speedup).", ""]
    if result.status != "complete":
        lines += [f"**Status: {result.status}** (the rows below are what finished).", ""]
    lines += [f"- {line}" for line in headline_lines(result) + memory_lines(result)] + [""]
    lines += _md_table(COLUMNS, table_rows(result)) + [""]
    if chart:
        lines += [f"![predicted vs measured]({chart})", ""]
    reasons = reason_lines(result)
    if reasons:
        lines += ["## Rows not compared", ""] + [f"- {line}" for line in reasons] + [""]
    lines += ["## Timelines: simulated next to the real run", "",
              "Open both in [Perfetto](https://ui.perfetto.dev) (or chrome://tracing). The PyTorch trace is "
              "one iteration (the last warm-up one) of rank 0; the simulated one covers every simulated "
              "iteration.",
              ""]
    rows = [[r.variant, _link(r.sim_trace), _link(r.real_trace), _breakdown(r)] for r in result.rows]
    header = ("variant", "simulated timeline", "PyTorch profiler trace", "where the time goes")
    lines += _md_table(header, rows)
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def write_report(result: ValidationResult, folder: str | Path) -> dict[str, Path]:
    """Write report.md and the chart into ``folder`` (which `validate` filled with validation.json and the
    traces); returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    chart = write_chart(result, folder / CHART)
    report = write_atomic(folder / REPORT, report_markdown(result, chart=CHART))
    return {"report": report, "chart": chart}
