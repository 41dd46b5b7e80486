"""`ddpdoctor guard --html FILE`: one self-contained page that shows a guarded run.

Each rank's step time over the run (an inline SVG chart), the collectives each rank had recorded
around a stall, a mismatch or an uneven end, side by side, and the findings. Nothing is loaded from
anywhere: the styles and the small script are inline, and the page's Content-Security-Policy allows
exactly those two and nothing else (no fetch, no image, no font, no frame), so that the page stays
whole in a CI artifact viewer or an air-gapped cluster. Every text that came from the job (paths,
messages, the command) is untrusted: it is escaped, control characters made visible, and a lone
surrogate written as its escape.

The page is drawn here, in Python, so that it shows with scripting off too; the script only adds a
cursor that reads off each rank's step time, and lets a click on a rank hide or show its line.
"""

from __future__ import annotations

import base64
import hashlib
import html
import statistics
from collections import Counter
from typing import Any, Iterable, Optional, Sequence

from ddpdoctor.guard.timeline import Call, Moment, Timeline
from ddpdoctor.lint.safe_write import atomic_write
from ddpdoctor.terminal import escape_controls

# Past this many ranks, the chart and the collectives show the ranks the findings name, then the
# slowest: dozens of lines on one chart are no longer a picture of anything.
MAX_RANKS_DRAWN = 16
MAX_DOTS = 60
WIDTH, HEIGHT = 960, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 40
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
          "#7f7f7f", "#bcbd22")

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}h3{font-size:14px;margin:18px 0 6px}
code,.mono,td.call{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
table{border-collapse:collapse;margin:4px 0}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f6f8fa}.summary{margin:8px 0;color:#57606a}
.sev-error .code{color:#cf222e;font-weight:600}.sev-warning .code{color:#9a6700;font-weight:600}
.sev-info .code{color:#0969da;font-weight:600}.scroll{overflow-x:auto}
td.call.waiting{background:#fff8c5}td.call.odd{background:#ffebe9}td.call.missing{color:#cf222e;
font-style:italic}td.call.before{color:#8c959f}.where{color:#57606a}.ok{color:#1a7f37}
svg text{font:11px system-ui,sans-serif;fill:#57606a}svg .axis{stroke:#8c959f}svg .grid{stroke:#eaeef2}
svg .cursor{stroke:#57606a;stroke-dasharray:3 3}svg polyline{fill:none;stroke-width:1.5}
svg circle{fill:#fff;stroke-width:1.5}svg .hidden{display:none}ul.keys{list-style:none;padding:0;margin:6px 0}
ul.keys li{display:inline-block;margin-right:14px;cursor:pointer}ul.keys li.off{opacity:.35}
.swatch{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:4px}
#readout{min-height:1.4em;color:#57606a}
"""
for _i, _c in enumerate(COLORS):
    STYLE += f".c{_i}{{stroke:{_c};background:{_c}}}"

SCRIPT = """
(function(){
var svg=document.getElementById('step-chart');
if(svg){
  var d=svg.dataset,x0=+d.x0,x1=+d.x1,y1=+d.y1,L=+d.left,R=+d.right,T=+d.top,B=+d.bottom;
  var lines=[].slice.call(svg.querySelectorAll('g.series'));
  var series=lines.map(function(g){return g.querySelector('polyline').getAttribute('points').trim().split(' ').map(function(s){
    var xy=s.split(',');return [+xy[0],+xy[1]];});});
  var cursor=svg.querySelector('.cursor'),out=document.getElementById('readout');
  svg.addEventListener('mousemove',function(ev){
    var box=svg.getBoundingClientRect(),x=(ev.clientX-box.left)*(+svg.getAttribute('width'))/box.width;
    if(x<L||x>R)return;
    cursor.setAttribute('x1',x);cursor.setAttribute('x2',x);cursor.setAttribute('visibility','visible');
    var step=Math.round(x0+(x-L)/(R-L)*(x1-x0)),parts=[];
    series.forEach(function(pts,i){
      if(lines[i].classList.contains('hidden')||!pts.length)return;
      var best=pts[0];pts.forEach(function(p){if(Math.abs(p[0]-x)<Math.abs(best[0]-x))best=p;});
      parts.push(lines[i].dataset.label+': '+((B-best[1])/(B-T)*y1).toFixed(1)+' ms');});
    out.textContent='step '+step+' \\u2014 '+parts.join(', ');
  });
  [].slice.call(document.querySelectorAll('ul.keys li')).forEach(function(li){
    li.addEventListener('click',function(){
      var line=svg.querySelector('g.series[data-rank="'+li.dataset.rank+'"]');
      if(line){line.classList.toggle('hidden');li.classList.toggle('off');}});});
}
document.documentElement.setAttribute('data-rendered','1');
})();
"""


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


# Only the page's own style and script, by their hashes: nothing else may load or run.
POLICY = (f"default-src 'none'; style-src '{_sha256(STYLE)}'; script-src '{_sha256(SCRIPT)}'; "
          "base-uri 'none'; form-action 'none'")


def text(value: Any) -> str:
    """Untrusted text as HTML text or attribute value."""
    return html.escape(escape_controls(str(value)), quote=True)


def render(report: dict[str, Any], timeline: Optional[Timeline]) -> str:
    """The page for one guarded run: `report` as report.report_dict makes it."""
    timeline = timeline or Timeline()
    findings = report.get("findings", [])
    world = int(report.get("world_size") or 0)
    named = [r for f in findings for r in f.get("ranks", [])]
    drawn = chosen_ranks(world, timeline, named)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>ddpdoctor guard: {text(' '.join(report.get('command', [])))}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>ddpdoctor guard</h1>",
        _header(report),
        _findings(findings),
        _chart(timeline, drawn, world),
        _collectives(timeline, drawn),
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _header(report: dict[str, Any]) -> str:
    summary = report.get("summary") or {}
    watched = "watched " + ", ".join(f"{summary.get(key, 0)} {noun}" for key, noun in (
        ("ranks", "ranks"), ("epochs", "epochs"), ("steps", "optimizer steps"), ("collectives", "collectives"),
        ("replica_checks", "replica checks"))) if summary else "no rank reported to this guard"
    elsewhere = (f"; the guard at {text(report['diagnosed_by'])} diagnosed this job" if report.get("diagnosed_by")
                 else "")
    return (f'<p class="mono" id="command">{text(" ".join(report.get("command", [])))}</p>'
            f'<p class="summary" id="summary">exit status {text(report.get("exit_code", ""))}; '
            f'world size {text(report.get("world_size", 0))}; {text(watched)}{elsewhere}</p>')


def _findings(findings: Sequence[dict[str, Any]]) -> str:
    if not findings:
        return '<h2>Findings</h2><p id="findings" class="ok">No finding.</p>'
    rows = []
    for f in findings:
        ranks = ", ".join(map(str, f.get("ranks", []))) or "all"
        rows.append(f'<tr class="finding sev-{text(f.get("severity", ""))}" data-code="{text(f.get("code", ""))}">'
                    f'<td class="code">{text(f.get("code", ""))}</td><td>{text(f.get("severity", ""))}</td>'
                    f'<td class="ranks">{text(ranks)}</td>'
                    f'<td class="mono where">{text(f.get("path", ""))}:{text(f.get("line", 0))}</td>'
                    f'<td class="message">{text(f.get("message", ""))}</td></tr>')
    return ('<h2>Findings</h2><div class="scroll"><table id="findings"><thead><tr><th>Code</th><th>Severity</th>'
            "<th>Ranks</th><th>Where</th><th>Message</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table></div>")


def _median_ms(timeline: Timeline, rank: int) -> Optional[float]:
    series = timeline.series.get(rank)
    if series is None or not series.buckets:
        return None
    return statistics.median(mean for _, mean, _ in series.points()) * 1000


def chosen_ranks(world: int, timeline: Timeline, named: Sequence[int]) -> list[int]:
    """The ranks drawn: all of them in a small job; else those the findings name, then the slowest."""
    everyone = sorted(set(range(world)) | set(timeline.series))
    if len(everyone) <= MAX_RANKS_DRAWN:
        return everyone
    slowest = sorted(everyone, key=lambda r: -(_median_ms(timeline, r) or 0.0))
    picked: list[int] = []
    for r in [*named, *slowest]:
        if r not in picked and len(picked) < MAX_RANKS_DRAWN:
            picked.append(r)
    return sorted(picked)


def _chart(timeline: Timeline, drawn: list[int], world: int) -> str:
    head = ("<h2>Step time</h2><p class=\"summary\">Each rank's time per optimizer step outside collectives "
            "(what it computes, not what it waits for the others); the slowest rank sets every step's pace.</p>")
    points = {r: timeline.series[r].points() for r in drawn if r in timeline.series and timeline.series[r].buckets}
    rows = "".join(_rank_row(timeline, r) for r in sorted(set(range(world)) | set(timeline.series)))
    table = ('<div class="scroll"><table id="ranks"><thead><tr><th>Rank</th><th>Steps timed</th>'
             "<th>Median ms</th><th>Slowest ms</th></tr></thead><tbody>" + rows + "</tbody></table></div>")
    if not points:
        return head + '<p id="no-steps">No optimizer step was timed (a step is timed from the second one).</p>' + table
    x0 = min(p[0][0] for p in points.values())
    x1 = max(p[-1][0] for p in points.values())
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = max(mean for p in points.values() for _, mean, _ in p) * 1000 * 1.05 or 1.0
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM

    def sx(step: float) -> float:
        return LEFT + (step - x0) / (x1 - x0) * (right - LEFT)

    def sy(ms: float) -> float:
        return bottom - ms / y1 * (bottom - TOP)

    svg = [f'<svg id="step-chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="step time per rank" data-x0="{x0}" '
           f'data-x1="{x1}" data-y1="{y1:.6g}" data-left="{LEFT}" data-right="{right}" data-top="{TOP}" '
           f'data-bottom="{bottom}">']
    for i in range(5):
        ms = y1 * i / 4
        y = sy(ms)
        svg.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{ms:.3g}</text>')
    for step in sorted({round(x0 + (x1 - x0) * i / 4) for i in range(5)}):
        svg.append(f'<text x="{sx(step):.1f}" y="{bottom + 16}" text-anchor="middle">{step}</text>')
    svg.append(f'<line class="axis" x1="{LEFT}" x2="{right}" y1="{bottom}" y2="{bottom}"/>'
               f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/>'
               f'<text x="{(LEFT + right) / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle">optimizer step</text>'
               f'<text x="12" y="{(TOP + bottom) / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 12 {(TOP + bottom) / 2:.0f})">ms</text>')
    for r, pts in points.items():
        xy = [(sx(step), sy(mean * 1000)) for step, mean, _ in pts]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        # A few points are marked too: a line of one point is not drawn at all.
        dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5"/>' for x, y in xy) if len(xy) <= MAX_DOTS else ""
        svg.append(f'<g class="series c{r % len(COLORS)}" data-rank="{r}" data-label="rank {r}"><title>rank {r}</title>'
                   f'<polyline points="{coords}"/>{dots}</g>')
    svg.append(f'<line class="cursor" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}" visibility="hidden"/></svg>')
    keys = "".join(f'<li data-rank="{r}"><span class="swatch c{r % len(COLORS)}"></span>rank {r}</li>'
                   for r in points)
    width = max(timeline.series[r].width for r in points)
    note = (f"<p class=\"summary\">{len(points)} of {len(set(range(world)) | set(timeline.series))} ranks drawn: "
            "those the findings name, then the slowest.</p>" if len(drawn) < world else "")
    averaged = (f" Each point is the mean of {width} steps." if width > 1 else "")
    return (head + note + '<div class="scroll">' + "".join(svg) + "</div>" + f'<ul class="keys">{keys}</ul>'
            + f'<p id="readout">{averaged.strip()}</p>' + table)


def _rank_row(timeline: Timeline, rank: int) -> str:
    series = timeline.series.get(rank)
    pts = series.points() if series is not None else []
    timed = sum(int(count) for _, _, count, _ in series.buckets) if series is not None else 0
    median = _median_ms(timeline, rank)
    slowest = max((most for _, _, most in pts), default=None)
    return (f'<tr class="rank" data-rank="{rank}"><td>rank {rank}</td><td>{timed}</td>'
            f"<td>{'' if median is None else f'{median:.1f}'}</td>"
            f"<td>{'' if slowest is None else f'{slowest * 1000:.1f}'}</td></tr>")


def _collectives(timeline: Timeline, drawn: list[int]) -> str:
    moments = list(timeline.moments) or ([timeline.end] if timeline.end is not None else [])
    if not moments:
        return '<h2>Collectives</h2><p id="no-collectives">No collective was recorded.</p>'
    out = ['<h2>Collectives</h2><p class="summary">Each rank\'s last recorded collectives, aligned by their '
           "position in their group's sequence; a call that differs from the others' at the same position is red, "
           "the one a rank was blocked in is yellow.</p>"]
    for index, moment in enumerate(moments):
        title = (f"{moment.code} on {_ranks(moment.ranks)}: {moment.message}" if moment.code
                 else "At the end of the run")
        out.append(f'<section class="moment" data-code="{text(moment.code)}" id="moment-{index}">'
                   f"<h3>{text(title)}</h3>{_side_by_side(moment, drawn)}</section>")
    return "".join(out)


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _side_by_side(moment: Moment, drawn: list[int]) -> str:
    ranks = [r for r in sorted(moment.calls) if r in drawn or r in moment.ranks]
    groups: list[str] = []
    for r in ranks:
        for call in moment.calls[r]:
            if call.group not in groups:
                groups.append(call.group)
    tables = []
    for group in sorted(groups, key=lambda g: (g != "init", g != "W", g)):  # in the order they start
        by_rank = {r: {c.seq: c for c in moment.calls[r] if c.group == group} for r in ranks}
        seqs = sorted({seq for calls in by_rank.values() for seq in calls})
        name = {"W": "world group", "init": "process group start-up"}.get(group, f"group of ranks {group}")
        head = "".join(f'<th data-rank="{r}">rank {r}<br><span class="where">{text(moment.status.get(r, ""))}'
                       "</span></th>" for r in ranks)
        rows = []
        for seq in seqs:
            present = {r: calls[seq] for r, calls in by_rank.items() if seq in calls}
            cells = "".join(_cell(by_rank[r], seq, _majority(present.values())) for r in ranks)
            rows.append(f'<tr class="seq" data-seq="{seq}"><th>#{seq + 1}</th>{cells}</tr>')
        tables.append(f"<p>{text(name)}</p>" f'<div class="scroll"><table class="collectives" data-group="{text(group)}">'
                      f"<thead><tr><th>#</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
    return "".join(tables)


def _majority(calls: "Iterable[Call]") -> Optional[tuple[str, str]]:
    """The call most ranks made at one position; None when they all agree, or no call has a majority
    (then every call there is marked as differing)."""
    counts = Counter((c.op, c.signature) for c in calls)
    if len(counts) <= 1:
        return None
    (top, most), (_, second) = counts.most_common(2)
    return top if most > second else ("", "")


def _cell(calls: dict[int, Call], seq: int, common: Optional[tuple[str, str]]) -> str:
    call = calls.get(seq)
    if call is None:
        if calls and seq < max(calls):
            return '<td class="call before">·</td>'  # out of the rank's recorded window
        return '<td class="call missing">not entered</td>'
    kind = ["call", call.state]
    if common is not None and (call.op, call.signature) != common:
        kind.append("odd")
    waited = f" ({call.waited:.1f} s)" if call.state == "waiting" else ""
    return (f'<td class="{" ".join(kind)}" data-op="{text(call.op)}">{text(call.op)}({text(call.signature)})'
            f'<br><span class="where">{text(call.path)}:{call.line} — {call.state}{waited}</span></td>')


def write(path: str, page: str) -> None:
    """Write the page atomically (a temporary file in the same folder, renamed over the target), with
    the permissions a new file gets (or those of the file it replaces); raises OSError."""
    atomic_write(path, page.encode("utf-8", "backslashreplace"), new_file_mode=0o666)
