"""The static parts of report.html, Python strings so they ship without package-data rules: the
Jinja templates, autoescaped (only our CSS/JS and the SQL diff, which escapes each token itself, are
`Markup`), and the page's CSS and JS (inline: the page needs no network).

The JS filters, searches and reorders the server-rendered episodes of each viewer, driven by the
`data-ctl` controls; it never inserts text, so nothing from the data can run as code. The URL
fragment holds the filters (`#<viewer>.<control>=<value>&...`, `#failed`, `#<episode id>`).
"""

from __future__ import annotations

import functools
from typing import Any

from jinja2 import DictLoader, Environment, StrictUndefined
from markupsafe import Markup


def fmt(value: Any, kind: str = "f3") -> str:
    """A number as shown: 'pct' (percent, one decimal), 'fN' (N decimals), '+fN' (signed); '-' if none."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    sign, digits = "+" if kind.startswith("+") else "", int(kind.lstrip("+")[1:])
    return f"{round(value, digits) + 0.0:{sign}.{digits}f}"  # + 0.0: no "-0.000" for a tiny negative


def bar(value: Any) -> Markup:
    """A horizontal bar for a 0-1 value."""
    width = max(0.0, min(1.0, float(value))) * 100 if isinstance(value, (int, float)) else 0.0
    return Markup('<span class="bar"><span style="width:{:.1f}%"></span></span>').format(width)


MACROS = """
{% macro metrics_table(groups, first, names, words) %}
<table><tr><th>{{ first }}</th><th>n</th><th>{{ words.accuracy_label }}</th><th></th>
{% if words.sql %}<th>exact match</th><th>valid SQL</th>{% endif %}
<th>mean turns</th><th>tool calls</th><th>tool error rate</th></tr>
{% for name in names %}{% set m = groups[name] %}
<tr><td>{{ name }}</td><td>{{ m.get('n', 0)|int }}</td><td>{{ m.get(words.accuracy)|fmt('pct') }}</td>
<td>{{ m.get(words.accuracy)|bar }}</td>{% if words.sql %}<td>{{ m.get('exact_match')|fmt('pct') }}</td>
<td>{{ m.get('valid_sql_rate')|fmt('pct') }}</td>{% endif %}<td>{{ m.get('mean_turns')|fmt('f2') }}</td>
<td>{{ m.get('mean_tool_calls')|fmt('f2') }}</td><td>{{ m.get('tool_error_rate')|fmt('pct') }}</td></tr>
{% endfor %}</table>
{% endmacro %}

{% macro result_table(p) %}
<div class="rows-note{{ ' neg' if p.failed else '' }}">{{ p.summary }}</div>
{% if p.columns %}<table class="rows"><tr>{% for c in p.columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in p.rows %}<tr>{% for v in row %}<td>{% if v is none %}<span class="muted">NULL</span>{% else %}{{ v }}{% endif %}</td>{% endfor %}</tr>
{% endfor %}</table>{% endif %}
{% endmacro %}

{% macro sql_panel(s) %}
<div class="who">final vs gold SQL <span class="legend"><span class="gold-only">only in gold</span>
<span class="final-only">only in final</span></span></div>
{% if s.final is none %}<pre class="diff">(no answer)</pre>
{% elif s.diff.same %}<pre class="diff">{{ s.diff.html }}</pre><div class="rows-note">same tokens as gold (up to case and spacing)</div>
{% else %}<pre class="diff">{{ s.diff.html }}</pre>{% endif %}
<div class="sqlcols">
<div><div class="who">final SQL</div><pre data-find>{{ s.final if s.final is not none else '(no answer)' }}</pre>
<div class="who">its result</div>{{ result_table(s.final_rows) }}</div>
<div><div class="who">gold SQL</div><pre data-find>{{ s.gold }}</pre>
<div class="who">gold result</div>{{ result_table(s.gold_rows) }}</div>
</div>
{% endmacro %}

{% macro answer_panel(s) %}
<div class="sqlcols">
<div><div class="who">{{ s.answer_label }}</div><pre data-find>{{ s.final if s.final is not none else '(no answer)' }}</pre></div>
<div><div class="who">{{ s.truth_label }}</div><pre data-find>{{ s.gold }}</pre></div>
</div>
{% endmacro %}

{% macro episode(e) %}
<details class="item episode {{ 'ok' if e.solved else 'failed' }}" id="{{ e.id }}" data-task="{{ e.task_id }}"
{%- for k, v in e.data.items() %} data-{{ k }}="{{ v }}"{% endfor %}>
<summary><span class="badge">{{ '✓' if e.solved else '✗' }}</span><span class="tid" data-find>{{ e.task_id }}</span>
{%- for t in e.tags %}<span class="tag">{{ t }}</span>{% endfor %}<span class="tag">{{ e.db_id }}</span>
<span class="tag">{{ e.difficulty }}</span><span class="q" data-find>{{ e.question }}</span>
<span>reward {{ e.reward|fmt('f3') }}</span></summary>
<div class="body">
<div class="kv"><div>question</div><div>{{ e.question }}</div>
{% for k, v in e.facts %}<div>{{ k }}</div><div>{{ v }}</div>{% endfor %}
{% if e.error %}<div>error</div><div>{{ e.error }}</div>{% endif %}</div>
{% if e.sql.get('plain') %}{{ answer_panel(e.sql) }}{% else %}{{ sql_panel(e.sql) }}{% endif %}
<div class="who">reward terms</div><table class="comp">
{% for k, v in e.terms.items() %}<tr><td>{{ k }}</td><td>{{ v|fmt('f3') }}</td></tr>{% endfor %}</table>
<details class="conv"><summary>conversation ({{ e.turns|length }} messages)</summary>
{% for t in e.turns %}<div class="turn {{ t.cls }}"><div class="who">{{ t.who }}</div><pre>{{ t.text }}</pre></div>
{% endfor %}</details>
</div></details>
{% endmacro %}

{% macro options(values) %}<option value="">all</option>
{% for v in values %}<option value="{{ v }}">{{ v }}</option>{% endfor %}{% endmacro %}

{% macro common_controls(dbs, n_failed, n_solved) %}
<label>show <select data-ctl="status" name="status"><option value="">all</option>
<option value="failed">failed ({{ n_failed }})</option><option value="solved">solved ({{ n_solved }})</option></select></label>
<label>database <select data-ctl="eq" data-field="db" name="db">{{ options(dbs) }}</select></label>
<label>search <input type="search" data-ctl="text" name="q" placeholder="question or answer" size="22"></label>
{% endmacro %}

{% macro tail_controls(total) %}
<button type="button" data-act="open">open shown</button> <button type="button" data-act="close">close all</button>
<span>showing <b class="shown-count">{{ total }}</b> of {{ total }}</span>
{% endmacro %}
"""

EPISODES = """
{% from "macros.html" import episode, common_controls, tail_controls, options %}
<h2 id="episodes">Episodes</h2>
<details><summary class="muted">System prompt (shared by all episodes)</summary><pre>{{ ev.system_prompt }}</pre></details>
<p class="muted">{{ rows_note }}</p>
<section class="viewer" data-viewer="eval" data-shown="{{ ev.episodes|length }}">
<div class="controls">
{{ common_controls(ev.dbs, failed, ev.episodes|length - failed) }}
<label>difficulty <select data-ctl="eq" data-field="difficulty" name="difficulty">{{ options(difficulties) }}</select></label>
<label>sort <select data-ctl="sort" name="sort"><option value="order:1">as evaluated</option>
<option value="reward:-1">reward, high first</option><option value="reward:1">reward, low first</option>
<option value="turns:-1">turns, most first</option><option value="db:1">database</option></select></label>
{{ tail_controls(ev.episodes|length) }}
</div>
<div class="items">
{% for e in ev.episodes %}{{ episode(e) }}{% endfor %}
</div></section>
"""

ROLLOUTS = """
{% from "macros.html" import episode, common_controls, tail_controls %}
<h2 id="training-rollouts">Training rollouts</h2>
<p class="muted">{{ ro.episodes|length }} sampled training episodes from {{ ro.groups|length }} steps
(steps {{ ro.first_step }}-{{ ro.last_step }}), {{ ro.solved }} solved; the advantage is the one the update used.</p>
<details><summary class="muted">System prompt (shared by the rollouts)</summary><pre>{{ ro.system_prompt }}</pre></details>
{% if ro.side_by_side %}<h3 id="groups">GRPO groups side by side ({{ ro.side_by_side|length }})</h3>
<p class="muted">Each group: one task's episodes at one step, the contrast its advantages come from.</p>
{% for g in ro.side_by_side %}<details class="sbs" data-step="{{ g.step }}" data-task="{{ g.task_id }}">
<summary>step {{ g.step }} · {{ g.task_id }} · {{ g.members|length }} episodes · {{ g.solved }} solved ·
reward {{ g.low|fmt('f3') }} to {{ g.high|fmt('f3') }} · {{ g.question }}</summary>
<div class="kv"><div>gold</div><div><pre>{{ g.gold }}</pre></div></div>
<table class="comp sbs-table"><tr><th></th>{% for m in g.members %}<th>member {{ m.member }}</th>{% endfor %}</tr>
<tr><td>reward</td>{% for m in g.members %}<td>{{ m.reward|fmt('f3') }}</td>{% endfor %}</tr>
<tr><td>advantage</td>{% for m in g.members %}<td>{{ m.advantage|fmt('+f3') }}</td>{% endfor %}</tr>
<tr><td>solved</td>{% for m in g.members %}<td>{{ '✓' if m.solved else '✗' }}</td>{% endfor %}</tr>
<tr><td>used in the update</td>{% for m in g.members %}<td>{{ 'yes' if m.used else 'no' }}</td>{% endfor %}</tr>
{% for t in g.terms %}<tr><td>{{ t }}</td>{% for m in g.members %}<td>{{ m.terms.get(t)|fmt('f3') }}</td>{% endfor %}</tr>
{% endfor %}<tr><td>final answer</td>{% for m in g.members %}<td><pre>{{ m.final if m.final is not none else '(no answer)' }}</pre></td>{% endfor %}</tr>
</table></details>
{% endfor %}{% endif %}
<section class="viewer" data-viewer="rollouts" data-shown="{{ ro.episodes|length }}">
<div class="controls">
<label>steps <input type="number" data-ctl="min" data-field="step" name="step-min" min="{{ ro.first_step }}"
max="{{ ro.last_step }}" placeholder="{{ ro.first_step }}" size="5"> to <input type="number" data-ctl="max" data-field="step"
name="step-max" min="{{ ro.first_step }}" max="{{ ro.last_step }}" placeholder="{{ ro.last_step }}" size="5"></label>
{{ common_controls(ro.dbs, ro.episodes|length - ro.solved, ro.solved) }}
<label>reward from <input type="number" step="any" data-ctl="min" data-field="reward" name="reward-min" size="5">
to <input type="number" step="any" data-ctl="max" data-field="reward" name="reward-max" size="5"></label>
<label>sort <select data-ctl="sort" name="sort"><option value="step:1">by step</option>
<option value="step:-1">by step, latest first</option><option value="reward:-1">reward, high first</option>
<option value="reward:1">reward, low first</option><option value="advantage:-1">advantage, high first</option>
<option value="advantage:1">advantage, low first</option></select></label>
{{ tail_controls(ro.episodes|length) }}
</div>
<div class="items">
{% for g in ro.groups %}<div class="group-head" data-group="{{ g.step }}">step {{ g.step }} · {{ g.n }} episodes ·
{{ g.solved }} solved · mean reward {{ g.reward|fmt('f3') }} · mean advantage {{ g.advantage|fmt('+f3') }} ·
{{ g.used }} used in the update</div>
{% for e in g.episodes %}{{ episode(e) }}{% endfor %}
{% endfor %}
</div></section>
"""

PAGE = """<!DOCTYPE html>
{% from "macros.html" import metrics_table %}
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>{{ css }}</style>
</head>
<body data-total="{{ ev.episodes|length }}" data-failed="{{ failed }}" data-shown="{{ ev.episodes|length }}">
<header><h1>{{ title }}</h1><div class="meta">{{ meta }}</div>
<nav>{% if run %}<a href="#run">training run</a> {% endif %}<a href="#summary">summary</a>{% if comparison %} <a href="#comparison">comparison</a>{% endif %}
<a href="#by-difficulty">by difficulty</a>{% if anatomy %} <a href="#errors">why answers are wrong</a>{% endif %} <a href="#episodes">evaluation episodes ({{ ev.episodes|length }})</a>
{% if ro %}<a href="#training-rollouts">training rollouts ({{ ro.episodes|length }})</a>{% endif %}</nav></header>
<main>
{% if run %}<h2 id="run">Training run</h2>
<p class="meta">{{ run.state }}</p>
{% if run.curves %}<img class="curves" alt="training curves" src="{{ run.curves }}">{% endif %}{% endif %}
<h2 id="summary">Summary</h2>
<div class="cards">{% for label, value in cards %}<div class="card"><div class="v">{{ value }}</div><div class="k">{{ label }}</div></div>{% endfor %}</div>
<table>{% for label, value in summary %}<tr><td>{{ label }}</td><td>{{ value }}</td></tr>{% endfor %}</table>
{% if comparison %}
<h2 id="comparison">Compared with {{ comparison.label }}</h2>
<table><tr><th>metric</th><th>{{ comparison.base_label }}</th><th>this run</th><th>delta</th></tr>
{% for row in comparison.rows %}<tr><td>{{ row.label }}</td><td>{{ row.base|fmt }}</td><td>{{ row.current|fmt }}</td>
<td class="{{ row.cls }}">{{ row.delta|fmt('+f3') }}</td></tr>{% endfor %}</table>
{% for w in comparison.warnings %}<div class="warn">warning: {{ w }}</div>{% endfor %}
{% if comparison.changes is none %}<p class="muted">{{ comparison.missing }}</p>
{% else %}<div class="changes">
{% for title, cls, items in [('Newly solved', 'pos', comparison.changes.newly_solved), ('Newly broken', 'neg', comparison.changes.newly_broken)] %}
<div class="change-list" data-change="{{ cls }}"><h3 class="{{ cls }}">{{ title }} ({{ items|length }} of {{ comparison.changes.compared }} questions)</h3>
<ul>{% for r in items %}<li><a href="#{{ comparison.ids.get(r.task_id, '') }}">{{ r.task_id }}</a> <span class="tag">{{ r.db_id }}</span>
<span class="tag">{{ r.difficulty }}</span> {{ r.question }}</li>{% else %}<li class="muted">none</li>{% endfor %}</ul></div>
{% endfor %}</div>{% endif %}
{% if comparison.anatomy %}<h3>Why answers are wrong, {{ comparison.base_label }} vs this run</h3>
<table><tr><th>error</th><th>{{ comparison.base_label }}</th><th>this run</th><th>change of its rate [95% paired bootstrap]</th></tr>
{% for row in comparison.anatomy %}<tr><td>{{ row.label }}</td><td>{{ row.base }}</td><td>{{ row.current }}</td>
<td>{% if row.change %}{{ (100 * row.change.delta)|fmt('+f1') }} points [{{ (100 * row.change.low)|fmt('+f1') }}, {{ (100 * row.change.high)|fmt('+f1') }}]{% else %}-{% endif %}</td></tr>{% endfor %}</table>
<p class="muted">Counts over the questions both runs have (first sample of each); a negative change is fewer such errors.</p>{% endif %}
{% endif %}
<h2 id="by-difficulty">By difficulty</h2>
<div class="split">{{ metrics_table(by_difficulty, 'difficulty', difficulties, words) }}
{% if image %}<img alt="{{ words.accuracy_label }} by difficulty" src="{{ image }}">{% endif %}</div>
{% if pass_at_k %}<h2>pass@k ({{ num_samples }} samples per question)</h2><table>
{% for k, v in pass_at_k %}<tr><td>pass@{{ k }}</td><td>{{ v|fmt('pct') }}</td><td>{{ v|bar }}</td></tr>{% endfor %}</table>{% endif %}
{% if anatomy %}<h2 id="errors">Why answers are wrong</h2>
<p class="muted">Each wrong answer classified against its gold query (the first category that holds, in this order).</p>
<div class="split"><table><tr><th>error</th><th>answers</th><th>share of wrong</th><th>rate</th></tr>
{% for row in anatomy %}<tr><td>{{ row.label }}</td><td>{{ row.count }}</td><td>{{ row.share|fmt('pct') }}</td><td>{{ row.rate|fmt('pct') }}</td></tr>{% endfor %}</table>
{% if errors_image %}<img alt="why answers are wrong" src="{{ errors_image }}">{% endif %}</div>{% endif %}
{% if by_db %}<h2>By database</h2>
<details><summary>per-database table ({{ by_db|length }} databases)</summary>{{ metrics_table(by_db, 'database', by_db|sort, words) }}</details>{% endif %}
{% include "episodes.html" %}
{% if ro %}{% include "rollouts.html" %}{% endif %}
</main>
<script>{{ js }}</script>
</body>
</html>
"""

CSS = """
:root { --ok: #2e7d32; --bad: #c62828; --muted: #666; --line: #ddd; --bg: #fafafa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #222; background: #fff; }
header { background: #24324a; color: #fff; padding: 16px 28px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header .meta { color: #c9d3e6; font-size: 13px; }
main { padding: 8px 28px 40px; max-width: 1400px; }
h2 { font-size: 18px; margin: 26px 0 10px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border: 1px solid var(--line); padding: 4px 10px; text-align: right; font-variant-numeric: tabular-nums; }
th:first-child, td:first-child { text-align: left; }
th { background: #eef1f6; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 10px 16px; min-width: 150px; background: var(--bg); }
.card .v { font-size: 24px; font-weight: 600; }
.card .k { color: var(--muted); font-size: 12px; }
.bar { width: 160px; height: 12px; background: #e8e8e8; border-radius: 3px; display: inline-block; vertical-align: middle; }
.bar > span { display: block; height: 100%; background: #4c72b0; border-radius: 3px; }
.split { display: flex; gap: 24px; flex-wrap: wrap; align-items: flex-start; }
.split img { max-width: 520px; border: 1px solid var(--line); }
img.curves { max-width: 100%; border: 1px solid var(--line); }
.pos { color: var(--ok); } .neg { color: var(--bad); }
.controls { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid var(--line); z-index: 2;
            display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; }
.controls input[type=number] { width: 5.5em; }
header nav { margin-top: 6px; font-size: 13px; }
header nav a { color: #dfe7f5; margin-right: 14px; }
.group-head { margin: 14px 0 4px; padding: 4px 8px; background: #eef1f6; border-radius: 4px; font-weight: 600; }
.sbs { margin: 4px 0; } .sbs-table td { vertical-align: top; } .sbs-table pre { white-space: pre-wrap; max-width: 48ch; margin: 0; }
.gold-only { background: #fde2e2; color: #a01818; text-decoration: line-through; }
.final-only { background: #dcf1dc; color: #1b5e20; }
.legend { font-weight: 400; text-transform: none; margin-left: 8px; }
.legend span { padding: 0 4px; border-radius: 2px; }
.sqlcols { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 14px; }
table.rows { font: 12px/1.3 ui-monospace, monospace; margin-top: 2px; }
table.rows td, table.rows th { text-align: left; padding: 2px 6px; max-width: 320px; overflow-wrap: anywhere; }
.rows-note { font-size: 12px; color: var(--muted); }
.rows-note.neg { color: var(--bad); }
details.conv > summary { cursor: pointer; font-size: 12px; font-weight: 600; color: var(--muted); text-transform: uppercase; margin: 6px 0; }
.changes { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 18px; }
.changes h3 { font-size: 15px; margin: 8px 0 4px; }
.changes ul { margin: 0; padding-left: 18px; }
.warn { color: #8a5a00; }
[hidden] { display: none !important; }
details.episode { border: 1px solid var(--line); border-left: 5px solid var(--ok); border-radius: 4px; margin: 6px 0; background: #fff; }
details.episode.failed { border-left-color: var(--bad); }
details.episode > summary { cursor: pointer; padding: 6px 10px; list-style: none; display: flex; gap: 10px; align-items: baseline; }
details.episode > summary::-webkit-details-marker { display: none; }
details.episode[open] > summary { background: var(--bg); border-bottom: 1px solid var(--line); }
.badge { font-weight: 700; min-width: 14px; }
.ok .badge, .badge.ok { color: var(--ok); } .failed .badge { color: var(--bad); }
.tid { font-family: ui-monospace, monospace; color: var(--muted); }
.tag { font-size: 12px; background: #eef1f6; border-radius: 3px; padding: 0 6px; }
.q { flex: 1; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.body { padding: 8px 14px 12px; }
.kv { display: grid; grid-template-columns: 130px 1fr; gap: 4px 12px; margin-bottom: 8px; }
.kv > div:nth-child(odd) { color: var(--muted); }
pre { white-space: pre-wrap; word-break: break-word; background: #f5f6f8; border: 1px solid #e3e6ea; border-radius: 4px;
      padding: 6px 8px; margin: 2px 0 8px; font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
.turn { margin: 6px 0; }
.turn .who { font-size: 12px; font-weight: 600; color: var(--muted); text-transform: uppercase; }
.turn.assistant pre { background: #eef4ff; border-color: #d3e0fb; }
.turn.tool pre { background: #f3f8ef; border-color: #dbe9d0; }
.comp td:first-child { font-family: ui-monospace, monospace; }
.muted { color: var(--muted); }
"""

JS = """
(function () {
  'use strict';
  function all(root, selector) { return Array.prototype.slice.call(root.querySelectorAll(selector)); }

  function hashParams() {
    var hash = window.location.hash.slice(1), out = {};
    if (hash === 'failed') { out['eval.status'] = 'failed'; return out; }  // a link to just the failures
    if (hash.indexOf('=') < 0) { return out; }
    hash.split('&').forEach(function (pair) {
      var i = pair.indexOf('=');
      if (i <= 0) { return; }
      try {
        out[decodeURIComponent(pair.slice(0, i))] = decodeURIComponent(pair.slice(i + 1).replace(/[+]/g, ' '));
      } catch (err) { /* a malformed escape: that pair is ignored */ }
    });
    return out;
  }

  // Sort on data-<field>: numbers numerically (missing ones last either way), else text; ties keep page order.
  function sorter(field, dir) {
    return function (a, b) {
      if (field === 'order') { return dir * (a.position - b.position); }
      var x = a.getAttribute('data-' + field) || '', y = b.getAttribute('data-' + field) || '';
      var nx = parseFloat(x), ny = parseFloat(y), c;
      if (!isNaN(nx) && !isNaN(ny)) { c = nx - ny; }
      else if (isNaN(nx) && isNaN(ny)) { c = x < y ? -1 : (x > y ? 1 : 0); }
      else { return isNaN(nx) ? 1 : -1; }
      return dir * c || a.position - b.position;
    };
  }

  function passes(item, control) {
    var kind = control.getAttribute('data-ctl'), value = control.value.trim();
    if (!value || kind === 'sort') { return true; }
    var own = item.getAttribute('data-' + control.getAttribute('data-field'));
    if (kind === 'status') { return (item.getAttribute('data-failed') === '1') === (value === 'failed'); }
    if (kind === 'eq') { return own === value; }
    if (kind === 'text') {
      return value.toLowerCase().split(/\\s+/).every(function (w) { return item.searchText.indexOf(w) >= 0; });
    }
    var limit = parseFloat(value), mine = parseFloat(own);
    if (isNaN(limit)) { return true; }
    return kind === 'min' ? mine >= limit : (kind === 'max' ? mine <= limit : true);
  }

  function Viewer(root) {
    var name = root.getAttribute('data-viewer'), list = root.querySelector('.items');
    var items = all(list, '.item'), controls = all(root, '[data-ctl]'), heads = {};
    var sortControl = root.querySelector('[data-ctl="sort"]'), shown = root.querySelector('.shown-count');
    all(list, '.group-head').forEach(function (h) { heads[h.getAttribute('data-group')] = h; });
    items.forEach(function (item, i) {
      item.position = i;
      item.searchText = all(item, '[data-find]').map(function (n) { return n.textContent; }).join('\\n').toLowerCase();
    });
    function apply() {
      var n = 0, parts = (sortControl ? sortControl.value : 'order:1').split(':');
      var field = parts[0], dir = parseFloat(parts[1]) || 1, grouped = field === 'step';
      var fragment = document.createDocumentFragment(), placed = {};
      items.forEach(function (item) {
        item.hidden = !controls.every(function (c) { return passes(item, c); });
        if (!item.hidden) { n += 1; }
      });
      Object.keys(heads).forEach(function (k) { heads[k].hidden = true; });
      items.slice().sort(sorter(field, dir)).forEach(function (item) {
        var head = grouped ? heads[item.getAttribute('data-step')] : null;
        if (head && !placed[item.getAttribute('data-step')]) { fragment.appendChild(head); placed[item.getAttribute('data-step')] = true; }
        if (head && !item.hidden) { head.hidden = false; }
        fragment.appendChild(item);
      });
      list.appendChild(fragment);
      shown.textContent = String(n);
      root.setAttribute('data-shown', String(n));
      if (name === 'eval') { document.body.setAttribute('data-shown', String(n)); }
    }
    return {
      apply: apply,
      restore: function (params) {
        controls.forEach(function (c) { if (params[name + '.' + c.name] !== undefined) { c.value = params[name + '.' + c.name]; } });
      },
      state: function (out) {
        controls.forEach(function (c) {
          var value = c.value.trim(), initial = c.options ? c.options[0].value : '';
          if (value && value !== initial) { out[name + '.' + c.name] = value; }
        });
      },
      listen: function (changed) {
        controls.forEach(function (c) { c.addEventListener(c.tagName === 'SELECT' ? 'change' : 'input', changed); });
        all(root, '[data-act]').forEach(function (button) {
          button.addEventListener('click', function () {
            var open = button.getAttribute('data-act') === 'open';
            items.forEach(function (item) { item.open = open && !item.hidden; });
          });
        });
      }
    };
  }

  var viewers = all(document, 'section.viewer').map(Viewer), params = hashParams();
  function writeHash() {
    var state = {};
    viewers.forEach(function (v) { v.state(state); });
    var hash = Object.keys(state).map(function (k) { return encodeURIComponent(k) + '=' + encodeURIComponent(state[k]); }).join('&');
    try { history.replaceState(null, '', hash ? '#' + hash : window.location.pathname + window.location.search); }
    catch (err) { /* some browsers refuse it on file:// pages: the filters still work */ }
  }
  viewers.forEach(function (v) {
    v.restore(params);
    v.apply();
    v.listen(function () { v.apply(); writeHash(); });
  });
  function reveal() {  // #e12 / #r3 (the newly solved/broken links): show and open that episode
    var id = window.location.hash.slice(1), target = id && id.indexOf('=') < 0 ? document.getElementById(id) : null;
    if (target && target.classList.contains('item')) { target.hidden = false; target.open = true; target.scrollIntoView(); }
  }
  window.addEventListener('hashchange', reveal);
  reveal();
  document.body.setAttribute('data-ready', '1');
})();
"""

TEMPLATES = {"macros.html": MACROS, "episodes.html": EPISODES, "rollouts.html": ROLLOUTS, "page.html": PAGE}


@functools.cache
def environment() -> Environment:
    """The Jinja environment of the report (autoescaping, undefined names are errors)."""
    env = Environment(loader=DictLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.filters["bar"] = bar
    return env
