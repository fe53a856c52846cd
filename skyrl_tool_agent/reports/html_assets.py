"""Static parts of report.html: its CSS and its JS (inline: the page needs no network). Kept as
Python strings so they ship with the package without package-data rules.

The JS filters, searches and reorders the server-rendered episodes of each viewer, driven by the
`data-ctl` controls; it never inserts text, so nothing from the data can run as code. The URL
fragment holds the filters (`#<viewer>.<control>=<value>&...`, `#failed`, `#<episode id>`).
"""

from __future__ import annotations

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
