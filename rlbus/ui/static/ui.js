// rlbus ui keys: j/k or arrows move through a table's rows, Enter/o opens the row's link,
// "/" focuses the filters, n/p page, g then r/o/c/s goes to a section, ? shows the keys.
(function () {
  "use strict";
  let table = null;
  let row = -1;
  let pendingG = false;

  function tables() { return Array.from(document.querySelectorAll("table.nav")); }
  function rows(t) { return t ? Array.from(t.tBodies[0] ? t.tBodies[0].rows : []) : []; }

  function select(t, i) {
    const all = rows(t);
    if (!all.length) return;
    if (table) rows(table).forEach((r) => r.classList.remove("selected"));
    table = t;
    row = Math.max(0, Math.min(all.length - 1, i));
    const r = all[row];
    r.classList.add("selected");
    r.scrollIntoView({ block: "nearest" });
    const link = r.querySelector("a");
    if (link) link.focus({ preventScroll: true });
  }

  function move(delta) {
    const ts = tables();
    if (!ts.length) return;
    if (!table) { select(ts[0], 0); return; }
    const next = row + delta;
    const at = ts.indexOf(table);
    if (next >= rows(table).length && at + 1 < ts.length) { select(ts[at + 1], 0); return; }
    if (next < 0 && at > 0) { select(ts[at - 1], rows(ts[at - 1]).length - 1); return; }
    select(table, next);
  }

  function open() {
    if (!table || row < 0) return;
    const link = rows(table)[row].querySelector("a");
    if (link) link.click();
  }

  function focusFilters() {
    const field = document.querySelector("#filters input, #filters select, #console textarea, form.filters input");
    if (field) { field.focus(); if (field.select) field.select(); }
  }

  function follow(rel) {
    const link = document.querySelector('a[rel="' + rel + '"]');
    if (link) link.click();
  }

  function go(key) {
    const link = document.querySelector('header.top nav a[data-key="' + key + '"]');
    if (link) link.click();
  }

  document.addEventListener("keydown", function (e) {
    const help = document.getElementById("help");
    const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(e.target.tagName);
    if (e.key === "Escape") {
      if (help) help.hidden = true;
      if (typing) e.target.blur();
      return;
    }
    if (typing) {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && e.target.form) {
        e.preventDefault();
        e.target.form.submit();
      }
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (pendingG) { pendingG = false; go(e.key); e.preventDefault(); return; }
    switch (e.key) {
      case "j": case "ArrowDown": move(1); break;
      case "k": case "ArrowUp": move(-1); break;
      case "Enter": case "o": if (table) open(); else return; break;
      case "/": focusFilters(); break;
      case "n": follow("next"); break;
      case "p": follow("prev"); break;
      case "g": pendingG = true; break;
      case "?": if (help) help.hidden = !help.hidden; break;
      default: return;
    }
    e.preventDefault();
  });
})();
