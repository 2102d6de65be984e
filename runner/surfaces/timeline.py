"""The timeline page of one or more runs: one self-contained HTML file.

The page holds inline CSS and SVG only: no script, no font, image or style
sheet from anywhere, no link, so it opens from disk, shows the same offline
and prints. Free text from the journal (owner ids, reasons, errors) is
written with the characters that could start a reference (``:``, ``/``,
``=``) as character references, so the file holds no sequence that a browser
or a scanner could follow; the text reads the same.

From :class:`runner.surfaces.history.History` it draws, on one time axis: a lane per
lease holder and epoch (takeovers, breaks, releases, and crashes: where the
holder's last durable write fell and how long until the lease moved on);
steps as bars per attempt with their backoff waits; effects by the state
they entered, with the exceptional ones (uncertain, absent, failed, and
those settled by observation after their outcome was unknown) always drawn
one by one and the settled ones joined to where they went unresolved;
approvals; the cancellation and what was in flight then; jobs. The report
figures are a table on top.

Size is bounded: ordinary effect transitions are drawn one by one up to
:data:`INDIVIDUAL_LIMIT` per run, and above it as counts per time bucket
(:data:`BUCKETS` per run), so the page grows with the exceptional facts
(crashes, uncertain effects, approvals), not with the number of effects.
A page of more than :data:`MAX_SECTIONS` runs draws the most eventful ones
and lists every run in the index.
"""

import html
import math
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..base.times import parse_time
from ..contract.spec import contract_of
from .history import EXCEPTIONAL, EffectPath, History
from ..ledger.states import UNRESOLVED
from .views import possible_duplicates

__all__ = ["render", "write", "INDIVIDUAL_LIMIT", "BUCKETS", "MAX_SECTIONS"]

INDIVIDUAL_LIMIT = 1500
BUCKETS = 240
MAX_SECTIONS = 40

WIDTH = 1200
LABEL = 190
RIGHT = 16
PLOT = WIDTH - LABEL - RIGHT
ROW = 16

EFFECT_ROWS = ("started", "acknowledged", "uncertain", "verified", "absent", "deferred", "failed", "reopened")
#: How each row of effects is labelled: a deferral is the target's "not now", apart from an absence; a reopening
#: is a person's new budget of attempts for a failed effect, no absence either.
ROW_LABELS = {"deferred": "deferred (not now)", "reopened": "reopened by a person"}
STATE_COLOURS = {"started": "#6b8fd6", "acknowledged": "#3d6fc4", "uncertain": "#e08a00", "verified": "#2e9d57",
                 "absent": "#c8322f", "deferred": "#a0785a", "failed": "#222222", "reopened": "#7a5cc4",
                 "planned": "#999999"}
#: The waits drawn under the rows: the backoff after an absence, and the time a "not now" asked for.
WAIT_COLOURS = {"absent": "#e0b050", "deferred": "#d9c2a7"}
STEP_COLOURS = {"done": "#2e9d57", "failed": "#c8322f", "cancelled": "#8a8a8a", "interrupted": "#e08a00",
                "running": "#3d6fc4"}
JOB_COLOURS = {"submitting": "#9bb3e0", "running": "#3d6fc4", "finished": "#2e9d57", "vanished": "#e08a00",
               "cancel-requested": "#b07cc6", "stopped": "#8a8a8a"}

CSS = ("""
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;"""
       """color:#1c1c1c;background:#fff;margin:18px 24px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:13px;margin:12px 0 4px}
p.note{color:#555;margin:2px 0 8px}p.headline{font-size:14px;margin:2px 0 6px}
p.warn{color:#8a4b00;background:#fff4e0;padding:4px 8px;border-left:3px solid #e08a00}
table{border-collapse:collapse;margin:4px 0 10px;font-size:12px}
th,td{border:1px solid #d7d7d7;padding:2px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fdecea}
svg{display:block;width:100%;height:auto;margin:6px 0;font-size:11px}
svg text{fill:#333}svg .lab{font-weight:600}svg .small{font-size:9px;fill:#555}
.legend span{display:inline-block;margin:0 14px 4px 0;white-space:nowrap}
.legend svg{display:inline-block;width:22px;height:14px;margin:0 4px 0 0;vertical-align:-2px}
table.costs td.none{color:#888}
section{margin-bottom:18px}
@media print{body{margin:8mm}section{break-inside:avoid-page}h2{break-after:avoid}svg{max-width:100%}}
""")

_INERT = str.maketrans({":": "&#58;", "/": "&#47;", "=": "&#61;"})


def _t(value: Any) -> str:
    """Free text, escaped and inert (see the module docstring)."""
    return html.escape(str(value), quote=True).translate(_INERT)


def _fmt_time(seconds: float) -> str:
    whole = int(seconds)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(whole)) + ".%03d" % int((seconds - whole) * 1000) + " UTC"


def _fmt_span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


class _Axis:
    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.span = max(end - start, 0.001) * 1.02  # a margin after the last fact

    def x(self, at: float) -> float:
        """The abscissa of ``at``; what began before the axis (a holding a drop of history cut) begins at its start."""
        return round(LABEL + max(0.0, at - self.start) / self.span * PLOT, 1)

    def ticks(self) -> List[float]:
        raw = self.span / 8
        magnitude = 10 ** math.floor(math.log10(raw))
        step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
        return [self.start + i * step for i in range(int(self.span / step) + 1)]


#: The widest a character of each kind of label is drawn, in pixels: what a label is measured by before it is placed.
#: Generous, so that a label measured to fit does fit in any of the fonts the page names.
CHAR_WIDTH = {"": 7.2, "lab": 7.8, "small": 6.0}


def _fit(text: str, width: float, cls: str = "") -> str:
    """``text`` cut (with an ellipsis) to what ``width`` pixels hold in labels of class ``cls``."""
    most = max(1, int(width // CHAR_WIDTH[cls]))
    return text if len(text) <= most else text[:max(0, most - 1)] + "…"


def _width(text: str, cls: str = "") -> float:
    """The most ``text`` takes in labels of class ``cls``."""
    return len(text) * CHAR_WIDTH[cls]


class _Svg:
    """An SVG drawing built row by row; a label in the left column is cut to the column (its whole text its title)."""

    def __init__(self) -> None:
        self.parts: List[str] = []
        self.y = 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def label(self, text: str, y: float, cls: str = "") -> None:
        attribute = f' class="{cls}"' if cls else ""
        shown = _fit(text, LABEL - 10, cls)
        title = f"<title>{_t(text)}</title>" if shown != text else ""
        self.add(f'<text x="4" y="{y + 11}"{attribute}>{_t(shown)}{title}</text>')

    def done(self, title: str) -> str:
        height = self.y + 6
        return (f'<svg viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
                f'aria-label="{_t(title)}">'
                + "".join(self.parts) + "</svg>")


def _rect(x1: float, y: float, x2: float, h: float, fill: str, title: str, extra: str = "") -> str:
    width = max(round(x2 - x1, 1), 1.2)
    return f'<rect x="{x1}" y="{y}" width="{width}" height="{h}" fill="{fill}"{extra}><title>{_t(title)}</title></rect>'


def _summary_rows(history: History) -> List[Tuple[str, Any]]:
    figures = history.summary
    return [(name.replace("_", " "), value) for name, value in figures.items() if name not in ("cost", "spend")]


def _costs_table(history: History) -> str:
    """Each named cost of the run: what was spent, what calls in flight or unsettled hold reserved, against its limit
    where the contract sets one (none: none is set)."""
    spent, reserved = history.summary.get("cost") or {}, history.state["counters"].get("reserved") or {}
    limits = dict(contract_of(history.state).limits.cost_limits)
    names = sorted(set(spent) | set(reserved) | set(limits))
    if not names:
        return ""
    rows = []
    for name in names:
        bound = limits.get(name)
        limit = f'<td class="n">{_t(bound)}</td>' if bound is not None else '<td class="none">none</td>'
        rows.append(f'<tr><th>{_t(name)}</th><td class="n">{_t(spent.get(name, 0))}</td>'
                    f'<td class="n">{_t(reserved.get(name, 0))}</td>{limit}</tr>')
    return ('<table class="costs"><tr><th>cost</th><th>spent</th><th>reserved</th><th>limit</th></tr>'
            f'{"".join(rows)}</table>')

def _summary_table(history: History, columns: int = 4) -> str:
    cells = [f'<th>{_t(name)}</th><td class="n">{_t(value)}</td>' for name, value in _summary_rows(history)]
    rows = "".join("<tr>" + "".join(cells[i:i + columns]) + "</tr>" for i in range(0, len(cells), columns))
    return f'<table class="summary">{rows}</table>'


def _index_table(histories: Sequence[History], drawn: set) -> str:
    names = ["status", "revision", "elapsed_seconds", "recoveries", "effects", "effects_verified", "unknown_results",
             "reconciled_effects", "unresolved_effects", "retries", "repeated_steps"]
    head = ("<tr><th>run</th>" + "".join(f"<th>{_t(n.replace('_', ' '))}</th>" for n in names)
            + "<th>crashes</th><th>drawn</th></tr>")
    rows = []
    totals: Dict[str, float] = {}
    for history in histories:
        cells = []
        for name in names:
            value = history.summary.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in ("revision",):
                totals[name] = totals.get(name, 0) + value
            cells.append(f'<td class="n">{_t(value)}</td>')
        totals["crashes"] = totals.get("crashes", 0) + len(history.crashes)
        drawn_cell = "below" if history.task_id in drawn else "index only"
        bad = (' class="bad"'
               if history.summary.get("unresolved_effects") or history.summary.get("status") not in ("complete",)
               else "")
        rows.append(f"<tr{bad}><th>{_t(history.task_id)}</th>{''.join(cells)}"
                    f"<td class=\"n\">{len(history.crashes)}</td><td>{drawn_cell}</td></tr>")
    total = "<tr><th>all runs</th>" + "".join(
        f'<td class="n">{_t(round(totals[n], 3)) if n in totals else ""}</td>'
        for n in names) + f'<td class="n">{int(totals.get("crashes", 0))}</td><td></td></tr>'
    return f'<table class="summary">{head}{"".join(rows)}{total}</table>'


#: The legend: each mark of the drawing as the drawing draws it (inside a 22 by 14 picture), and what it is.
LEGEND = (
    ('<rect x="1" y="3" width="20" height="8" fill="#4a78c2"/>', "lease held"),
    ('<path d="M1 1L8 7L1 13z" fill="#e08a00"/><rect x="8" y="3" width="13" height="8" fill="#4a78c2"/>',
     "takeover of a lease nobody released"),
    ('<rect x="1" y="3" width="20" height="8" fill="url(#legend-dead)"/>', "holder stopped, lease not yet moved on"),
    ('<path d="M7 1l8 12m0 -12l-8 12" stroke="#c8322f" stroke-width="2.4"/>',
     "crash: the holder's last durable write"),
    ('<path d="M11 0l-3 7h5l-3 7" stroke="#c8322f" fill="none" stroke-width="1.6"/>',
     "lease broken by a supervisor"),
    ('<rect x="9" y="0" width="3" height="14" fill="#2e9d57"/>', "lease released"),
    ('<rect x="9" y="0" width="2.5" height="14" fill="#111"/>', "recover: its decision"),
    ('<rect x="1" y="3" width="9" height="8" fill="#2e9d57"/>'
     '<rect x="11" y="3" width="10" height="8" fill="#c8322f"/>',
     "step attempt: done, failed (and interrupted, cancelled)"),
    ('<rect x="1" y="5" width="20" height="4" fill="#f2d7a0"/>', "backoff before the next attempt"),
    ('<rect x="4" y="1" width="1.5" height="12" fill="#6b8fd6"/>'
     '<rect x="10" y="1" width="1.5" height="12" fill="#3d6fc4"/>'
     '<rect x="16" y="1" width="1.5" height="12" fill="#2e9d57"/>', "effect entering the state of its row"),
    ('<path d="M11 1l6 6l-6 6l-6 -6z" fill="#e08a00"/>', "outcome unknown (uncertain)"),
    ('<rect x="3" y="3" width="8" height="8" fill="#c8322f"/>'
     '<rect x="12" y="3" width="8" height="8" fill="#222222"/>', "observed absent; refused for good"),
    ('<rect x="4" y="1" width="1.5" height="10" fill="#a0785a"/>'
     '<rect x="4" y="11" width="16" height="3" fill="#d9c2a7"/>',
     "the target's 'not now' and the wait it asked for (not an absence)"),
    ('<rect x="10" y="1" width="1.5" height="12" fill="#7a5cc4"/>',
     "a failed effect reopened by a person (a new budget of attempts)"),
    ('<line x1="1" y1="3" x2="15" y2="7" stroke="#7b3fb0" stroke-dasharray="3 2"/>'
     '<circle cx="16" cy="7" r="5" fill="none" stroke="#7b3fb0" stroke-width="2.2"/>',
     "settled by observation after an unknown outcome"),
    ('<path d="M5 2l5 5l-5 5l-5 -5z" fill="#fff" stroke="#555"/>'
     '<line x1="10" y1="7" x2="17" y2="7" stroke="#2e9d57"/><circle cx="17" cy="7" r="4" fill="#2e9d57"/>',
     "approval requested, then granted, used, denied or superseded"),
    ('<line x1="11" y1="0" x2="11" y2="14" stroke="#8a4b00" stroke-width="2" stroke-dasharray="6 3"/>',
     "cancellation"),
    ('<line x1="11" y1="0" x2="11" y2="14" stroke="#8a4b00" stroke-dasharray="1 3"/>',
     "change of status, store repair, plan change"),
)


def _legend() -> str:
    """What each mark of the drawing is, each drawn as the drawing draws it (a small picture and its words)."""
    hatch = ('<defs><pattern id="legend-dead" width="6" height="6" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><rect width="3" height="6" fill="#c8322f"/>'
             '<rect x="3" width="3" height="6" fill="#fbe3e2"/></pattern></defs>')
    spans = []
    for icon, text in LEGEND:
        defs = hatch if "legend-dead" in icon else ""
        spans.append(f'<span><svg viewBox="0 0 22 14" aria-hidden="true">{defs}{icon}</svg>{_t(text)}</span>')
    return f'<p class="legend">{"".join(spans)}</p>'


def _draw_axis(svg: _Svg, axis: _Axis, height_hint: int) -> None:
    y = svg.y
    for tick in axis.ticks():
        x = axis.x(tick)
        said = "+" + _fmt_span(tick - axis.start)
        # Centred on its tick, or ending at it where the centred text would leave the drawing.
        anchor = "end" if x + _width(said, "small") / 2 > WIDTH - 2 else "middle"
        svg.add(f'<line x1="{x}" y1="{y + 14}" x2="{x}" y2="{y + 14 + height_hint}" stroke="#eee"/>')
        svg.add(f'<text x="{x}" y="{y + 11}" text-anchor="{anchor}" class="small">{_t(said)}</text>')
    svg.label("time from " + time.strftime("%H:%M:%S", time.gmtime(axis.start)) + " UTC", y, "small")
    svg.y += 16


def _draw_lanes(svg: _Svg, axis: _Axis, history: History) -> None:
    holdings = history.holdings
    svg.label("lease holders", svg.y, "lab")
    svg.y += ROW
    row = ROW if len(holdings) <= 60 else max(4, 900 // max(len(holdings), 1))
    for holding in holdings:
        y = svg.y
        end = holding.end if holding.end is not None else history.end
        name = f"{holding.owner} · epoch {holding.epoch}"
        svg.add(f'<g class="lane" data-owner="{_t(holding.owner)}" data-epoch="{holding.epoch}" '
                f'data-ended="{holding.ended}">')
        if row >= 12:
            epoch = f" · epoch {holding.epoch}"
            owner = _fit(str(holding.owner), LABEL - 10 - _width(epoch))
            shown = owner + epoch
            title = f"<title>{_t(name)}</title>" if shown != name else ""
            svg.add(f'<text x="4" y="{y + 10}">{_t(shown)}{title}</text>')
        dead_from = holding.last_write if holding.crashed else end
        title = (f"{name}: held from {_fmt_time(holding.start)}; {holding.writes} writes, {holding.renewals} renewals; "
                 f"ended {holding.ended}")
        if holding.end is not None:
            title += f" at {_fmt_time(holding.end)}"
        svg.add(_rect(axis.x(holding.start), y + 2, axis.x(dead_from), row - 5, "#4a78c2", title))
        if holding.takeover:
            x = axis.x(holding.start)
            svg.add(f'<path d="M{x - 6} {y + 1}L{x} {y + row / 2 - 1}L{x - 6} {y + row - 3}z" fill="#e08a00" '
                    'class="takeover"><title>'
                    f'{_t(f"takeover by {holding.owner} at epoch {holding.epoch}, {_fmt_time(holding.start)}")}'
                    '</title></path>')
        for at, decision, reason, action in holding.recoveries:
            x = axis.x(at)
            known = reason or action  # why it stopped, or what it chose to do
            said = f"{decision} ({known})" if known else decision
            svg.add(f'<rect x="{x - 1}" y="{y}" width="2.5" height="{row - 1}" fill="#111" class="recover"><title>'
                    f'{_t(f"recover by {holding.owner}: {said} at {_fmt_time(at)}")}</title></rect>')
        if holding.crashed:
            xs, xe = axis.x(holding.last_write), axis.x(end)
            how = {"broken": f"lease broken by {holding.broken_by}: {holding.reason}",
                   "expired": "lease expired and was taken over",
                   "superseded": "lease re-acquired by the same owner id"}[holding.ended]
            flight = ", ".join(holding.in_flight[:8]) + (f" and {len(holding.in_flight) - 8} more"
                                                         if len(holding.in_flight) > 8 else "")
            svg.add(_rect(xs, y + 2, xe, row - 5, "url(#dead)",
                          f"{name} stopped without releasing; {how} at {_fmt_time(end)}"))
            svg.add(f'<g class="crash" data-epoch="{holding.epoch}">'
                    f'<path d="M{xs - 4} {y + 1}l8 {row - 4}m0 -{row - 4}l-8 {row - 4}" '
                    'stroke="#c8322f" stroke-width="2.4"/><title>'
                    f'{_t(f"crash: {name} last wrote at {_fmt_time(holding.last_write)}; {how}")}'
                    f'{_t("; in flight: " + flight) if flight else ""}'
                    f'{_t("; step " + holding.step_at_end) if holding.step_at_end else ""}</title></g>')
            if holding.ended == "broken":
                svg.add(f'<path d="M{xe} {y}l-3 {row / 2}h5l-3 {row / 2}" stroke="#c8322f" fill="none" '
                        'stroke-width="1.6" class="break">'
                        f'<title>{_t(how)}</title></path>')
        elif holding.ended == "released":
            x = axis.x(end)
            svg.add(f'<rect x="{x - 1}" y="{y}" width="3" height="{row - 1}" fill="#2e9d57" class="release">'
                    f'<title>{_t(f"{name} released the lease at {_fmt_time(end)}")}</title></rect>')
        svg.add("</g>")
        svg.y += row


def _draw_steps(svg: _Svg, axis: _Axis, history: History) -> None:
    order: List[Any] = [s.id for s in contract_of(history.state).steps]
    for attempt in history.steps:
        if attempt.step not in order:
            order.append(attempt.step)
    svg.label("steps", svg.y, "lab")
    svg.y += ROW
    for step in order:
        y = svg.y
        svg.label(step, y - 1)
        for attempt in (a for a in history.steps if a.step == step):
            end = attempt.end if attempt.end is not None else history.end
            title = (f"step {step} attempt {attempt.attempt}: {attempt.outcome}, {_fmt_time(attempt.start)} to "
                     f"{_fmt_time(end)}")
            if attempt.error:
                title += f"; {attempt.error_class} error: {attempt.error}"
            svg.add(_rect(axis.x(attempt.start), y + 2, axis.x(end), ROW - 5, STEP_COLOURS.get(attempt.outcome, "#777"),
                          title, f' class="step {attempt.outcome}"'))
            if attempt.wait_until is not None:
                svg.add(_rect(axis.x(end), y + 5, axis.x(attempt.wait_until), ROW - 11, "#f2d7a0",
                              f"backoff after attempt {attempt.attempt}: no new attempt before "
                              f"{_fmt_time(attempt.wait_until)}", ' class="wait"'))
        svg.y += ROW


def _step_word(path: EffectPath, at: float, state: str) -> str:
    """A transition of an effect's path as the tables say it: a deferral and a reopening are no absence."""
    return "not now" if path.deferred(at, state) else "reopened" if path.reopened(at, state) else state


def _draw_effects(svg: _Svg, axis: _Axis, history: History) -> Dict[str, int]:
    """Effect transitions by the state entered; returns how many were drawn one by one and how many aggregated."""
    effects = list(history.effects.values())
    ordinary: Dict[str, List[Tuple[float, str]]] = {state: [] for state in EFFECT_ROWS}
    special: List[Tuple[float, str, Any, bool]] = []
    for path in effects:
        previous = None
        for at, state, _epoch, settled in path.transitions:
            # Settled by observation: flagged so in the journal, or right after the effect was uncertain.
            observed = state in ("verified", "absent") and (settled or previous == "uncertain")
            if path.deferred(at, state):
                ordinary["deferred"].append((at, path.key))  # "not now": a row of its own, never an absence
            elif path.reopened(at, state):
                ordinary["reopened"].append((at, path.key))  # a person's reopening: no absence either
            elif state in EXCEPTIONAL or observed:
                special.append((at, state, path, observed))
            elif state in ordinary:
                ordinary[state].append((at, path.key))
            previous = state
    count = sum(len(v) for v in ordinary.values())
    individual = count <= INDIVIDUAL_LIMIT
    svg.label(f"effects ({len(effects)})", svg.y, "lab")
    svg.y += ROW
    rows: Dict[str, float] = {}
    for state in EFFECT_ROWS:
        rows[state] = svg.y
        svg.label(ROW_LABELS.get(state, state), svg.y - 1)
        svg.add(f'<line x1="{LABEL}" y1="{svg.y + ROW / 2}" x2="{LABEL + PLOT}" y2="{svg.y + ROW / 2}" '
                'stroke="#f0f0f0"/>')
        marks = ordinary[state]
        colour = STATE_COLOURS[state]
        if individual:
            for at, key in marks:
                x = axis.x(at)
                said = {"deferred": "answered 'not now'", "reopened": "reopened by a person"}.get(state, state)
                svg.add(f'<rect x="{x}" y="{svg.y + 2}" width="1.2" height="{ROW - 4}" fill="{colour}" '
                        f'class="effect{" deferred" if state == "deferred" else ""}" data-key="{_t(key)}">'
                        f'<title>{_t(f"{key} {said} at {_fmt_time(at)}")}</title></rect>')
        elif marks:
            buckets: Dict[int, int] = {}
            for at, _key in marks:
                index = min(BUCKETS - 1, int((at - axis.start) / axis.span * BUCKETS))
                buckets[index] = buckets.get(index, 0) + 1
            peak = max(buckets.values())
            width = PLOT / BUCKETS
            for index, n in sorted(buckets.items()):
                h = max(1.5, (ROW - 3) * n / peak)
                t1 = axis.start + index * axis.span / BUCKETS
                svg.add(f'<rect x="{round(LABEL + index * width, 1)}" y="{round(svg.y + ROW - 1 - h, 1)}" '
                        f'width="{round(width, 1)}" height="{round(h, 1)}" fill="{colour}" class="bucket">'
                        f'<title>{n} {state} from {_t(_fmt_time(t1))} '
                        f'to {_t(_fmt_time(t1 + axis.span / BUCKETS))}</title></rect>')
        svg.y += ROW
    for at, state, path, settled in special:
        if state not in rows:
            continue
        x, y = axis.x(at), rows[state] + ROW / 2
        if settled and state in ("verified", "absent"):
            # Join the settlement to where the effect's outcome became unknown: its last unresolved transition before.
            before = [(t, s) for t, s, _, _ in path.transitions if t <= at and s in UNRESOLVED]
            if before:
                t0, s0 = before[-1]
                svg.add(f'<line x1="{axis.x(t0)}" y1="{rows.get(s0, y) + ROW / 2}" x2="{x}" y2="{y}" stroke="#7b3fb0" '
                        'stroke-width="1" stroke-dasharray="3 2"/>')
                if s0 != "uncertain":
                    svg.add(f'<circle cx="{axis.x(t0)}" cy="{rows[s0] + ROW / 2}" r="3" fill="{STATE_COLOURS[s0]}"/>')
            svg.add(f'<circle cx="{x}" cy="{y}" r="5" fill="none" stroke="#7b3fb0" stroke-width="2.2" '
                    f'class="reconciled" data-key="{_t(path.key)}"><title>'
                    f'{_t(f"{path.key} {state} by observation at {_fmt_time(at)}, after its outcome was unknown")}'
                    f'</title></circle><circle cx="{x}" cy="{y}" r="2" fill="{STATE_COLOURS[state]}"/>')
        elif state == "uncertain":
            svg.add(f'<path d="M{x} {y - 6}l6 6l-6 6l-6 -6z" fill="{STATE_COLOURS[state]}" class="uncertain" '
                    f'data-key="{_t(path.key)}"><title>'
                    f'{_t(path.key + " uncertain at " + _fmt_time(at) + ": " + (path.reason or ""))}</title></path>')
        else:
            svg.add(f'<rect x="{x - 4}" y="{y - 4}" width="8" height="8" fill="{STATE_COLOURS[state]}" '
                    f'class="effect-{state}" data-key="{_t(path.key)}">'
                    f'<title>{_t(f"{path.key} {state} at {_fmt_time(at)}")}</title></rect>')
    for path in effects:
        for t1, t2 in path.waits:
            svg.add(_rect(axis.x(t1), rows["absent"] + 11, axis.x(t2), 3, WAIT_COLOURS["absent"],
                          f"{path.key}: backoff until {_fmt_time(t2)}", ' class="wait"'))
        for t1, t2 in path.deferrals:
            svg.add(_rect(axis.x(t1), rows["deferred"] + 11, axis.x(t2), 3, WAIT_COLOURS["deferred"],
                          f"{path.key}: the target said 'not now'; no call before {_fmt_time(t2)}",
                          ' class="wait not-now"'))
    return {"individual": count if individual else 0, "aggregated": 0 if individual else count,
            "exceptional": len(special)}


def _draw_approvals(svg: _Svg, axis: _Axis, history: History) -> None:
    if not history.approvals:
        return
    y = svg.y
    svg.label(f"approvals ({len(history.approvals)})", y, "lab")
    cy = y + ROW / 2
    for approval in history.approvals.values():
        x = axis.x(approval.requested_at)
        what = f"approval {approval.rid}: {approval.action} in step {approval.step}"
        svg.add(f'<path d="M{x} {cy - 5}l5 5l-5 5l-5 -5z" fill="#fff" stroke="#555" class="approval-request"><title>'
                f'{_t(f"{what} requested at {_fmt_time(approval.requested_at)}")}</title></path>')
        answers = [(approval.answered_at, "granted" if approval.state in ("granted", "used") else approval.state,
                    approval.by),
                   (approval.used_at, "used", approval.used_by), (approval.superseded_at, "superseded", None)]
        for at, kind, who in answers:
            if at is None:
                continue
            ax = axis.x(at)
            colour = {"granted": "#2e9d57", "denied": "#c8322f", "used": "#3d6fc4",
                      "superseded": "#8a8a8a"}.get(kind, "#555")
            svg.add(f'<line x1="{x + 5}" y1="{cy}" x2="{ax}" y2="{cy}" stroke="{colour}"/>')
            svg.add(f'<circle cx="{ax}" cy="{cy}" r="4.5" fill="{colour}" class="approval-{kind}"><title>'
                    f'{_t(f"{what} {kind}" + (f" by {who}" if who else "") + f" at {_fmt_time(at)}")}</title></circle>')
    svg.y += ROW


def _draw_jobs(svg: _Svg, axis: _Axis, history: History) -> None:
    if not history.jobs:
        return
    svg.label("jobs", svg.y, "lab")
    svg.y += ROW
    for key, changes in sorted(history.jobs.items()):
        y = svg.y
        svg.label(key, y - 1)
        for index, (at, state, detail) in enumerate(changes):
            end = (changes[index + 1][0] if index + 1 < len(changes)
                   else (history.end if state in ("submitting", "running") else at))
            words = ", ".join(f"{k} {v}" for k, v in detail.items())
            svg.add(_rect(axis.x(at), y + 2, axis.x(end), ROW - 5, JOB_COLOURS.get(state, "#777"),
                          f"job {key} {state} at {_fmt_time(at)}" + (f" ({words})" if words else ""),
                          f' class="job {state}"'))
        svg.y += ROW


#: Rows of labels above the lanes for the run's marks: changes of status, repairs, plan changes, the cancellation.
#: A label that finds no room there is left out of the drawing (its line keeps its whole text as its title) and
#: listed below it.
MARK_ROWS = 3
MARK_ROW = 11
MARK_CHARS = 48
MARK_COLOURS = {"status": "#8a4b00", "repair": "#b07cc6", "migrate": "#3d6fc4"}


class _Mark(NamedTuple):
    """One vertical mark across the drawing, and where its label goes (``row`` None: no room for it)."""

    at: float
    kind: str  # status, repair, migrate, cancel
    text: str
    row: Optional[int] = None
    x: float = 0.0  # where the label's text is anchored
    anchor: str = "start"


def _marks(history: History, axis: _Axis) -> List[_Mark]:
    """The run's marks in time order, each label placed in the first row where it overlaps no other.

    A label stands right of its line, or left of it where it would leave
    the drawing; it is measured as :data:`CHAR_WIDTH` says, so two labels
    placed apart are drawn apart.
    """
    found = [(at, kind, text) for at, kind, text in history.marks if not (kind == "status" and text == "run active")]
    if history.cancellation:
        found.append((history.cancellation["at"], "cancel", "cancelled"))
    taken: List[List[Tuple[float, float]]] = [[] for _ in range(MARK_ROWS)]
    placed = []
    for at, kind, text in sorted(found, key=lambda m: m[0]):
        x = axis.x(at)
        shown = text if len(text) <= MARK_CHARS else text[:MARK_CHARS - 1] + "…"
        width = _width(shown, "small")
        start, anchor, tx = x + 3, "start", x + 3
        if start + width > WIDTH - 2:
            start, anchor, tx = x - 3 - width, "end", x - 3
        span = (start - 3, start + width + 3)
        row = next((r for r in range(MARK_ROWS) if all(span[1] <= a or span[0] >= b for a, b in taken[r])), None)
        if row is not None and span[0] >= LABEL - 2:
            taken[row].append(span)
            placed.append(_Mark(at, kind, shown, row, tx, anchor))
        else:
            placed.append(_Mark(at, kind, text))
    return placed


def _band_rows(marks: Sequence[_Mark]) -> int:
    """The rows of labels the marks take."""
    return 1 + max((m.row for m in marks if m.row is not None), default=-1)


def _draw_marks(svg: _Svg, axis: _Axis, history: History, marks: Sequence[_Mark], top: int) -> None:
    """Each mark's line from its label's row down through the drawing, and its label (see :func:`_marks`)."""
    for mark in marks:
        x = axis.x(mark.at)
        label = ""
        if mark.row is not None:
            label = (f'<text x="{round(mark.x, 1)}" y="{top + 8 + mark.row * MARK_ROW}" text-anchor="{mark.anchor}" '
                     f'class="small mark">{_t(mark.text)}</text>')
        if mark.kind == "cancel" and history.cancellation:
            cancel = history.cancellation
            flight = cancel["in_flight"]
            text = f"cancelled by {cancel['by']}: {cancel['reason']}; in flight: {', '.join(flight[:10]) or 'nothing'}"
            svg.add(f'<g class="cancellation"><line x1="{x}" y1="{top}" x2="{x}" y2="{svg.y}" stroke="#8a4b00" '
                    f'stroke-width="2" stroke-dasharray="6 3"/>{label}<title>{_t(text)}</title></g>')
            continue
        colour = "#2e9d57" if mark.kind == "status" and "complete" in mark.text else MARK_COLOURS.get(mark.kind, "#555")
        title = _t(f"{mark.text} at {_fmt_time(mark.at)}")
        svg.add(f'<g class="marked {mark.kind}"><line x1="{x}" y1="{top}" x2="{x}" y2="{svg.y}" stroke="{colour}" '
                f'stroke-width="1" stroke-dasharray="1 3"/>{label}<title>{title}</title></g>')


def _marks_table(history: History, marks: Sequence[_Mark]) -> str:
    """Every mark, as a table, when the drawing had no room for the label of one of them."""
    if all(m.row is not None for m in marks):
        return ""
    rows = "".join(f"<tr><td>{_t(_fmt_time(m.at))}</td><td>{_t(m.kind)}</td><td>{_t(m.text)}</td></tr>" for m in marks)
    return (f"<h3>Marks ({len(marks)}): more than the drawing has room to name</h3>"
            f"<table><tr><th>at</th><th>kind</th><th>what</th></tr>{rows}</table>")


def _tables(history: History) -> str:
    out = []
    if history.crashes:
        rows = "".join(
            f"<tr><td>{_t(h.owner)}</td><td class=\"n\">{h.epoch}</td><td>{_t(_fmt_time(h.last_write))}</td>"
            f"<td>{_t(h.ended)}"
            f"{_t(' by ' + str(h.broken_by)) if h.broken_by else ''}</td><td>{_t(_fmt_time(h.end or history.end))}</td>"
            f"<td>{_t(h.step_at_end or '')}</td>"
            f"<td>{_t(', '.join(h.in_flight[:6]) + (' …' if len(h.in_flight) > 6 else ''))}</td></tr>"
            for h in history.crashes)
        out.append(f"<h3>Crashes: holders that stopped without releasing ({len(history.crashes)})</h3>"
                   "<table><tr><th>holder</th><th>epoch</th>"
                   "<th>last durable write</th><th>lease moved on</th><th>at</th><th>step running</th>"
                   f"<th>effects in flight</th></tr>{rows}</table>"
                   '<p class="note">A worker that died before its first durable write left nothing in the journal, '
                   'and is not drawn.</p>')
    flagged = possible_duplicates(history.state)
    if flagged:
        rows = "".join(f"<tr><td>{_t(key)}</td><td>{_t('; '.join(reasons))}</td></tr>"
                       for key, reasons in flagged[:300])
        out.append(f'<h3 class="check">To check: effects that may have a duplicate at the target ({len(flagged)})</h3>'
                   f"<table><tr><th>key</th><th>why</th></tr>{rows}</table>"
                   '<p class="note">The runner did not call these twice blindly; the ledger shows a pattern a person '
                   'should check at the target.</p>')
    special = [p for p in history.effects.values() if p.exceptional]
    if special:
        shown = special[:300]
        rows = "".join(
            f'<tr><td>{_t(p.key)}</td><td>{_t(" → ".join(_step_word(p, t, s) for t, s, _, _ in p.transitions))}</td>'
            f'<td class="n">{p.attempts}</td><td class="n">{p.deferral_count}</td>'
            f'<td>{"by observation" if p.reconciled else ""}</td><td>{_t(p.reason or "")}</td></tr>' for p in shown)
        more = (f"<p class=\"note\">… and {len(special) - len(shown)} more, all drawn above.</p>"
                if len(special) > len(shown) else "")
        out.append(f"<h3>Effects that were uncertain, absent, failed or reconciled ({len(special)})</h3>"
                   "<table><tr><th>key</th><th>path</th>"
                   "<th>attempts</th><th>deferrals (not now)</th><th>settled</th><th>last reason</th></tr>"
                   f"{rows}</table>{more}")
    reopened = [(p, at, by, why) for p in history.effects.values() for at, by, why in p.reopenings]
    if reopened:
        rows = "".join(f"<tr><td>{_t(p.key)}</td><td>{_t(_fmt_time(at))}</td><td>{_t(str(by))}</td>"
                       f"<td>{_t(str(why))}</td><td>{_t(p.state)}</td></tr>" for p, at, by, why in reopened[:300])
        out.append(f"<h3>Failed effects reopened by a person ({len(reopened)})</h3><table><tr><th>key</th><th>at</th>"
                   f"<th>by</th><th>why</th><th>now</th></tr>{rows}</table>")
    if history.approvals:
        rows = "".join(
            f"<tr><td>{_t(a.rid)}</td><td>{_t(a.step)}</td><td>{_t(a.action)}</td><td>{_t(a.state)}"
            f"{_t(', superseded') if a.superseded_at else ''}</td><td>{_t(a.by or '')}</td>"
            f"<td>{_t(a.used_by or '')}</td></tr>"
            for a in history.approvals.values())
        out.append("<h3>Approvals</h3><table><tr><th>request</th><th>step</th><th>action</th><th>state</th>"
                   "<th>answered by</th>"
                   f"<th>used by</th></tr>{rows}</table>")
    if history.cancellation:
        cancel = history.cancellation
        flight = cancel["in_flight"]
        out.append(f"<h3>Cancellation</h3><p>By {_t(cancel['by'])} at {_t(_fmt_time(cancel['at']))}: "
                   f"{_t(cancel['reason'])}. Step running: {_t(cancel['step'] or 'none')}. "
                   f"In flight then ({len(flight)}): {_t(', '.join(flight) or 'nothing')}.</p>")
    return "".join(out)


def _section(history: History, axis: _Axis) -> str:
    svg = _Svg()
    svg.add('<defs><pattern id="dead" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<rect width="3" height="6" fill="#c8322f"/>'
            '<rect x="3" width="3" height="6" fill="#fbe3e2"/></pattern></defs>')
    estimate = ROW * (len(history.holdings) + len(EFFECT_ROWS) + 8)
    _draw_axis(svg, axis, estimate)
    top = svg.y
    marks = _marks(history, axis)
    svg.y += _band_rows(marks) * MARK_ROW  # the marks' labels, above everything they cross
    _draw_lanes(svg, axis, history)
    _draw_steps(svg, axis, history)
    counts = _draw_effects(svg, axis, history)
    _draw_approvals(svg, axis, history)
    _draw_jobs(svg, axis, history)
    _draw_marks(svg, axis, history, marks, top)
    notes = _history_notes(history)
    if counts["aggregated"]:
        notes.append(f'<p class="note">{counts["aggregated"]} ordinary effect transitions are drawn as counts per '
                     f'time bucket; {counts["exceptional"]} exceptional ones one by one.</p>')
    state = history.state
    head = (f'<h2>Run {_t(history.task_id)}: {_t(state["status"])} at revision {state["revision"]}</h2>'
            f'<p class="headline">{_t(_headline(history))}</p>'
            f'<p class="note">Goal: {_t(str(contract_of(state).goal).rstrip("."))}. '
            f'From {_t(_fmt_time(history.start))} to {_t(_fmt_time(history.end))} '
            f"({_t(_fmt_span(history.end - history.start))}); journal records {history.first_rev} to "
            f"{history.last_rev}.</p>")
    drawing = svg.done("timeline of " + history.task_id)
    return (f'<section class="run" data-task="{_t(history.task_id)}">{head}{"".join(notes)}{drawing}'
            f'{_marks_table(history, marks)}{_tables(history)}</section>')


def _headline(history: History) -> str:
    """The run in one sentence, first under its title: its outcome, its effects, its holders and what went wrong."""
    figures = history.summary

    def count(n: Any, what: str) -> str:
        return f"{n} {what}" if n == 1 else f"{n} {what}s"

    said = [f"{figures['effects_verified']} of {count(figures['effects'], 'effect')} verified",
            f"{count(figures['lease_holders'], 'lease holder')}, "
            f"{figures['crashes']} of them stopped without releasing"]
    if figures.get("reconciled_effects"):
        said.append(f"{count(figures['reconciled_effects'], 'effect')} settled by observation after an unknown outcome")
    if figures.get("unresolved_effects"):
        said.append(f"{count(figures['unresolved_effects'], 'effect')} still unresolved")
    if figures.get("possible_duplicates"):
        said.append(f"{count(figures['possible_duplicates'], 'effect')} for a person to check at the target")
    return f"{str(figures['status']).capitalize()}: " + "; ".join(said) + "."


def _span(after: int, upto: int) -> str:
    return f"record {after + 1}" if upto - after == 2 else f"records {after + 1} to {upto - 1}"


def _history_notes(history: History) -> List[str]:
    """What the page cannot draw, said above it: a drop by the run's retention, damage, records never kept."""
    notes = []
    dropped = history.dropped
    if dropped:
        counters = dropped["counters"] if isinstance(dropped.get("counters"), dict) else {}
        holders = int(dropped["lease"].get("epoch") or 0) if isinstance(dropped.get("lease"), dict) else 0
        span = f'{_fmt_time(_when(dropped.get("first_at")))} to {_fmt_time(_when(dropped.get("last_at")))}'
        notes.append(f'<p class="note dropped">Journal records {_t(dropped.get("first"))} to '
                     f'{_t(dropped.get("through"))} ({_t(span)}) '
                     f"were dropped by the run's history retention ({_t(_policy(dropped.get('policy')))}): "
                     f"{_t(holders)} lease holdings, {_t(counters.get('recoveries', 0))} recoveries, "
                     f"{_t(counters.get('step_attempts', 0))} step attempts and "
                     f"{_t(counters.get('effect_attempts', 0))} "
                     "effect attempts there are counted in the figures above, not drawn.</p>")
    for text in history.damage:
        notes.append(f'<p class="warn damage">The run\'s history is damaged: {_t(text)}; doctor reports it.</p>')
    for after, upto in history.gaps:
        if history.damage:
            said = "are missing from the run's history (damage, above)"
        elif history.notes:
            said = "were compacted away before the run kept a history folder"
        else:
            said = "were compacted away before they were read"
        notes.append(f'<p class="warn">Journal {_span(after, upto)} {said}: what happened then is not drawn.</p>')
    return notes


def _when(text: Any) -> float:
    try:
        return parse_time(str(text))
    except ValueError:
        return 0.0


def _policy(policy: Any) -> str:
    if not isinstance(policy, dict) or not policy:
        return "no bound recorded"
    said = []
    if policy.get("keep_seconds") is not None:
        said.append(f"keep {_fmt_span(float(policy['keep_seconds']))}")
    if policy.get("keep_bytes") is not None:
        said.append(f"keep {int(policy['keep_bytes'])} bytes")
    return ", ".join(said)


def _eventful(history: History) -> Tuple[int, int]:
    return (len(history.crashes) + sum(1 for p in history.effects.values() if p.exceptional), len(history.effects))


def render(histories: Sequence[History], title: Optional[str] = None) -> str:
    """The page of ``histories`` (one or more runs) as one HTML document; see the module docstring."""
    if not histories:
        raise ValueError("a timeline needs at least one run")
    start = min(h.start for h in histories)
    end = max(h.end for h in histories)
    axis = _Axis(start, end)
    drawn = list(histories)
    if len(drawn) > MAX_SECTIONS:
        drawn = sorted(drawn, key=_eventful, reverse=True)[:MAX_SECTIONS]
        drawn.sort(key=lambda h: h.task_id)
    names = {h.task_id for h in drawn}
    title = title or (f"Run {histories[0].task_id}" if len(histories) == 1 else f"{len(histories)} runs")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{_t(title)}</title>",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<style>{CSS}</style></head><body>",
             f"<h1>{_t(title)}</h1>",
             f'<p class="note">Drawn from the journal, {_t(_fmt_time(start))} to {_t(_fmt_time(end))} '
             f'({_t(_fmt_span(end - start))}). Hover a mark for its details.</p>']
    if len(histories) == 1:
        parts.append(_summary_table(histories[0]) + _costs_table(histories[0]))
    else:
        parts.append(_index_table(histories, names))
        if len(drawn) < len(histories):
            parts.append(f'<p class="note">{len(drawn)} of {len(histories)} runs are drawn below: those with the most '
                         "crashes and exceptional effects. Every run is in the table.</p>")
    parts.append(_legend())
    parts += [_section(history, axis) for history in drawn]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write(path: str, histories: Sequence[History], title: Optional[str] = None) -> int:
    """Write the page to ``path`` (replacing it); return its size in bytes."""
    data = render(histories, title).encode("utf-8")
    with open(path, "wb") as handle:
        handle.write(data)
    return len(data)
