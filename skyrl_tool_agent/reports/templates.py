"""The Jinja templates of report.html, autoescaped: only our CSS/JS and the SQL diff (which escapes
each token itself) are `Markup`. Python strings, so they ship without package-data rules.
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

TEMPLATES = {"macros.html": MACROS, "episodes.html": EPISODES, "rollouts.html": ROLLOUTS, "page.html": PAGE}


@functools.cache
def environment() -> Environment:
    """The Jinja environment of the report (autoescaping, undefined names are errors)."""
    env = Environment(loader=DictLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.filters["bar"] = bar
    return env
