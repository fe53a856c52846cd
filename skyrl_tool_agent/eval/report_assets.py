"""Static parts of report.html: the page skeleton, its CSS and its JS (inline: the page needs no
network). Kept as Python strings so they ship with the package without package-data rules.

The skeleton is a `string.Template`; every substituted value is HTML built by `report.py` with all
model and database text escaped. The JS only filters (hides/shows) server-rendered episodes and
never inserts text, so nothing from the data can run as code.
"""

from __future__ import annotations

from string import Template

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
.pos { color: var(--ok); } .neg { color: var(--bad); }
.controls { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid var(--line); z-index: 2; }
.controls label { margin-right: 18px; }
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
  var onlyFailed = document.getElementById('only-failed');
  var difficulty = document.getElementById('difficulty-filter');
  var shown = document.getElementById('shown-count');
  var episodes = Array.prototype.slice.call(document.querySelectorAll('details.episode'));
  function apply() {
    var n = 0;
    episodes.forEach(function (e) {
      var keep = (!onlyFailed.checked || e.dataset.failed === '1') &&
                 (!difficulty.value || e.dataset.difficulty === difficulty.value);
      e.hidden = !keep;
      if (keep) { n += 1; }
    });
    shown.textContent = String(n);
    document.body.setAttribute('data-shown', String(n));
  }
  onlyFailed.addEventListener('change', apply);
  difficulty.addEventListener('change', apply);
  // report.html#failed opens with the filter on (a link to just the failures).
  if (window.location.hash === '#failed') { onlyFailed.checked = true; }
  apply();
  document.body.setAttribute('data-ready', '1');
})();
"""

PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>$css</style>
</head>
<body data-total="$total" data-failed="$failed">
<header><h1>$title</h1><div class="meta">$meta</div></header>
<main>
$summary
$comparison
<h2>By difficulty</h2>
<div class="split">$by_difficulty $difficulty_img</div>
$pass_at_k
<h2>By database</h2>
<details><summary>per-database table ($db_count databases)</summary>$by_db</details>
<h2>Episodes</h2>
<details><summary class="muted">System prompt (shared by all episodes)</summary><pre>$system_prompt</pre></details>
<div class="controls">
<label><input type="checkbox" id="only-failed"> only failed episodes ($failed)</label>
<label>difficulty <select id="difficulty-filter"><option value="">all</option>$difficulty_options</select></label>
<span>showing <b id="shown-count">$total</b> of $total episodes</span>
</div>
<div id="episodes">
$episodes
</div>
</main>
<script>$js</script>
</body>
</html>
""")
