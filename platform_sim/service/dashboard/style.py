"""The dashboard's stylesheet and refresh script, inlined into every page (nothing is loaded from elsewhere)."""

from __future__ import annotations

CSS = """
:root { --ink: #1d2433; --muted: #5f6b7d; --line: #dde2ea; --bg: #f5f7fa; --card: #fff; --accent: #2f5fd0;
  --run: #1f7a44; --stop: #b42318; --done: #5f6b7d; --best: #1f7a44; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
  color: var(--ink); background: var(--bg); }
header { display: flex; align-items: center; gap: 16px; padding: 10px 24px; background: #1d2433; color: #fff; }
header .brand { color: #fff; font-weight: 700; font-size: 17px; text-decoration: none; letter-spacing: .02em; }
header .tenant { color: #c9d2e3; margin-left: auto; }
header form { margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 40px; }
h1 { font-size: 22px; margin: 4px 0 14px; word-break: break-all; }
h2 { font-size: 16px; margin: 26px 0 10px; }
a { color: var(--accent); }
button, .button { font: inherit; padding: 6px 14px; border-radius: 6px; border: 1px solid var(--line);
  background: #fff; color: var(--ink); cursor: pointer; }
button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
header button { background: transparent; color: #fff; border-color: #5f6b7d; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px;
  min-width: 150px; }
.card .value { font-size: 22px; font-weight: 650; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.tabs { display: flex; gap: 6px; margin: 20px 0 10px; }
.tabs a { padding: 4px 12px; border-radius: 14px; text-decoration: none; border: 1px solid var(--line);
  background: #fff; color: var(--ink); }
.tabs a.on { background: var(--ink); color: #fff; border-color: var(--ink); }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line); }
th, td { padding: 7px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #eef1f6; font-weight: 600; white-space: nowrap; font-size: 13px; }
th a { color: var(--ink); text-decoration: none; }
th a.on { color: var(--accent); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.reason { color: var(--muted); max-width: 260px; }
td.job { white-space: nowrap; font-weight: 600; }
tr:hover td { background: #f8faff; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
  color: #fff; }
.badge.running { background: var(--run); } .badge.stopped { background: var(--stop); }
.badge.finished { background: var(--done); }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: 8px 20px;
  background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; margin: 0; }
.facts dt { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.facts dd { margin: 0 0 4px; word-break: break-word; }
figure { margin: 16px 0 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 8px 8px 4px; }
figcaption { color: var(--muted); font-size: 12px; padding: 2px 8px 6px; }
svg.curve { width: 100%; height: auto; display: block; }
svg.curve .frame { fill: #fbfcfe; stroke: var(--line); }
svg.curve .grid { stroke: #e9edf3; }
svg.curve .tick { fill: var(--muted); font-size: 11px; }
svg.curve .axis { fill: var(--muted); font-size: 12px; }
svg.curve .empty { fill: var(--muted); font-size: 14px; text-anchor: middle; }
svg.curve .line { fill: none; stroke: var(--accent); stroke-width: 2; }
svg.curve .dot { fill: var(--accent); }
svg.curve .stop-marker line { stroke: var(--stop); stroke-width: 2; stroke-dasharray: 5 4; }
svg.curve .stop-marker text { fill: var(--stop); font-size: 12px; font-weight: 600; }
svg.curve .best-marker line { stroke: var(--best); stroke-width: 1.5; stroke-dasharray: 2 3; }
svg.curve .best-marker .ring { fill: none; stroke: var(--best); stroke-width: 2; }
svg.curve .best-marker text { fill: var(--best); font-size: 12px; font-weight: 600; }
.muted { color: var(--muted); }
.pager { margin-top: 10px; display: flex; gap: 12px; align-items: center; }
.login { max-width: 420px; margin: 60px auto; background: var(--card); border: 1px solid var(--line);
  border-radius: 10px; padding: 24px 28px; }
.login label { display: block; font-weight: 600; margin: 14px 0 6px; }
.login input[type=password] { width: 100%; font: inherit; padding: 8px 10px; border: 1px solid var(--line);
  border-radius: 6px; }
.login .actions { margin-top: 16px; }
.error { color: var(--stop); font-weight: 600; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 13px; }
"""
"""The stylesheet of every page (in a nonce'd ``<style>``: the CSP allows no other style)."""

REFRESH_S = 30
"""Seconds between automatic refreshes of the list and job pages (while the page is visible)."""

REFRESH_JS = (
    "setInterval(function () { if (document.visibilityState === 'visible') { location.reload(); } }, "
    f"{REFRESH_S * 1000});"
)
"""The only script: reloads the page every :data:`REFRESH_S` seconds; without JavaScript the page is the same,
only not refreshed."""
