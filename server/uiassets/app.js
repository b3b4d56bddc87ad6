// kiln's web page: the fleet, a node's wiring, the queue and the projects,
// drawn from the server's /ui/api views and redrawn on its server-sent
// "change" events. Every text from the server goes in through textContent
// or an attribute, never as markup.
"use strict";

const main = document.getElementById("main");

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") e.textContent = v;
    // Styles go through the CSSOM: the policy refuses style attributes.
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

const SVG = "http://www.w3.org/2000/svg";
function sv(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// A project's colour, the same on every page.
function colour(p) {
  if (p === "another project") return "#9e9e9e";
  let h = 0;
  for (const c of p) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return `hsl(${h % 360} 65% 50%)`;
}

async function get(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (r.status === 401) throw new Error("not signed in: run 'kiln ui' and open the link it prints");
  if (!r.ok) {
    let msg = r.statusText;
    try { msg = (await r.json()).error || msg; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  return r.json();
}

function ago(t) {
  const s = Math.max(0, Math.round((Date.now() - new Date(t).getTime()) / 1000));
  return s < 90 ? `${s} s ago` : `${Math.round(s / 60)} min ago`;
}

function findingCounts(f) {
  const span = el("span", {});
  for (const sev of ["critical", "warning", "info"]) {
    const n = (f && f[sev]) || 0;
    span.append(el("span", { class: n ? "sev-" + sev : "muted", "data-sev": sev, text: `${n} ${sev}` }), " ");
  }
  return span;
}

function allocationMap(nodes) {
  const wrap = el("div", { class: "map-block" });
  const projects = new Set();
  for (const n of nodes) {
    const row = el("div", { class: "map", "data-map-node": n.id });
    row.append(el("span", { class: "muted", text: n.id, style: "width:9em;display:inline-block" }));
    for (const g of n.gpus) {
      const cls = "cell" + (g.drained ? " drained" : "");
      const who = (g.projects || []).join(", ");
      const util = g.utilization === undefined || g.utilization === null ? null : g.utilization;
      const title = `${n.id} GPU ${g.index}${g.mig ? " " + g.mig : ""}: ${who || (g.drained ? "drained" : "free")}` +
        (util === null ? "" : `, ${util}% busy`);
      const c = el("div", { class: cls, title, "data-gpu": g.id });
      if ((g.projects || []).length) {
        const p = g.projects[0];
        projects.add(p);
        c.style.borderColor = colour(p);
        c.style.borderWidth = "2px";
        // Filled by real use: an idle lease shows an empty cell.
        const f = el("div", { class: "fill" });
        f.style.background = colour(p);
        f.style.height = `${util === null ? 0 : Math.min(100, util)}%`;
        c.append(f);
      }
      row.append(c);
    }
    wrap.append(row);
  }
  const legend = el("p", { class: "legend" });
  for (const p of [...projects].sort()) {
    const sw = el("span", { class: "swatch" });
    sw.style.background = colour(p);
    legend.append(el("span", {}, sw, p));
  }
  legend.append(el("span", { class: "muted", text: "fill: the GPU's utilisation now" }));
  wrap.append(legend);
  return wrap;
}

async function fleet() {
  const f = await get("/ui/api/fleet");
  document.getElementById("who").textContent = f.user;
  const t = f.totals;
  const body = el("tbody");
  for (const n of f.nodes) {
    body.append(el("tr", { "data-node": n.id },
      el("td", {}, el("a", { href: "/ui/nodes/" + encodeURIComponent(n.id), text: n.id }), n.recorded ? el("span", { class: "muted", text: " (recorded)" }) : null),
      el("td", { text: n.state }),
      el("td", { class: "num", "data-col": "gpus", text: n.held + n.free + n.drained }),
      el("td", { class: "num", "data-col": "held", text: n.held }),
      el("td", { class: "num", "data-col": "free", text: n.free }),
      el("td", { class: "num", "data-col": "drained", text: n.drained }),
      el("td", {}, findingCounts(n.findings)),
      el("td", { class: "muted", text: ago(n.last_seen) })));
  }
  const foot = el("tfoot", {}, el("tr", {},
    el("td", { text: `${t.Nodes} nodes, ${t.Ready} ready` }), el("td"),
    el("td", { class: "num", "data-total": "gpus", text: t.GPUs }),
    el("td", { class: "num", "data-total": "held", text: t.Held }),
    el("td", { class: "num", "data-total": "free", text: t.Free }),
    el("td", { class: "num", "data-total": "drained", text: t.Drained }),
    el("td", {}, findingCounts(t.Findings)), el("td")));
  const table = el("table", { id: "fleet" },
    el("thead", {}, el("tr", {}, ...["Node", "State", "GPUs", "Held", "Free", "Drained", "Findings", "Last seen"].map(h => el("th", { text: h })))),
    body, foot);
  const ff = el("div", { id: "fleet-findings" });
  for (const x of f.fleet_findings || []) {
    const ev = el("ul", {});
    for (const e of x.evidence || []) ev.append(el("li", { text: e }));
    ff.append(el("div", { class: "finding sev-" + x.severity, "data-finding": x.id },
      el("div", {}, el("strong", { text: x.severity + ": " }), x.title),
      ev, x.remedy ? el("div", { class: "remedy" }, el("em", { text: "Fix: " }), x.remedy) : null));
  }
  if (!(f.fleet_findings || []).length) ff.append(el("p", { class: "muted", text: "None: every GPU model runs one firmware, every vendor one driver." }));
  main.replaceChildren(el("h1", { text: "Fleet" }), table, el("h2", { text: "Allocation" }), allocationMap(f.nodes),
    el("h2", { text: "Across nodes" }), ff);
}

async function queue() {
  const f = await get("/ui/api/fleet");
  const body = el("tbody");
  for (const q of f.queue || []) {
    body.append(el("tr", { "data-lease": q.id },
      el("td", { class: "num", text: q.position }), el("td", {}, el("a", { href: "/ui/leases/" + encodeURIComponent(q.id), text: q.id })), el("td", { text: q.project }),
      el("td", { text: q.user || "" }), el("td", { text: q.size }),
      el("td", { text: q.estimated_start ? new Date(q.estimated_start).toLocaleString() : "unknown" }),
      el("td", { text: q.reason || "" })));
  }
  main.replaceChildren(el("h1", { text: "Queue" }), (f.queue || []).length ? el("table", { id: "queue" },
    el("thead", {}, el("tr", {}, ...["#", "Lease", "Project", "User", "Asks for", "Estimated start", "Why it waits"].map(h => el("th", { text: h })))), body)
    : el("p", { class: "muted", text: "No lease waits." }));
}

async function projects() {
  const f = await get("/ui/api/fleet");
  const body = el("tbody");
  for (const p of f.projects || []) {
    const r1 = (x) => Math.round(x * 10) / 10;
    body.append(el("tr", { "data-project": p.name },
      el("td", {}, el("span", { class: "swatch", style: `background:${colour(p.name)}` }), p.name),
      el("td", { class: "num", text: r1(p.held) }), el("td", { class: "num", text: p.limit || "none" }),
      el("td", { class: "num", text: `${Math.round(p.share * 100)}%` }),
      el("td", { class: "num", "data-col": "busy", text: p.busy === undefined || p.busy === null ? (p.held ? "unknown" : "") : `${Math.round(p.busy)}%` }),
      el("td", { class: "num", text: r1(p.used_hours) }), el("td", { class: "num", text: p.queued })));
  }
  main.replaceChildren(el("h1", { text: "Projects" }), el("table", { id: "projects" },
    el("thead", {}, el("tr", {}, ...["Project", "GPUs held", "Limit", "Fair share", "Busy (held GPUs)", "GPU-hours this period", "Queued"].map(h => el("th", { text: h })))), body),
    el("p", { class: "muted", text: "Busy is the mean utilisation of the GPUs a project holds: an idle lease shows as a low figure." }));
}

// topology draws the node: NUMA nodes with their GPUs and NICs, the
// NVSwitches, and every link with its label; leased GPUs are tinted,
// degraded links dashed red.
function topology(n) {
  const gpus = n.gpus.filter(g => !g.parent);
  const byPCI = new Map();
  const numas = n.numa.length ? n.numa : [null];
  const W = 130, H = 54, gap = 24;
  const perRow = Math.max(1, Math.ceil(gpus.length / numas.length));
  const width = Math.max(600, perRow * (W + gap) + 2 * gap);
  const switchY = 40, gpuY = 150;
  const height = gpuY + numas.length * (H + 130) + 40;
  const s = sv("svg", { class: "topo", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `topology of ${n.id}` });
  // NVSwitches on top.
  n.switches.forEach((sw, i) => {
    const x = gap + i * (W + gap);
    s.append(sv("rect", { class: "box switch", x, y: switchY, width: W, height: 30, rx: 4 }));
    s.append(sv("text", { x: x + 8, y: switchY + 19 }, `NVSwitch ${sw}`));
    byPCI.set(sw, { x: x + W / 2, y: switchY + 30 });
  });
  numas.forEach((numa, row) => {
    const y = gpuY + row * (H + 130);
    const here = gpus.filter(g => numas.length === 1 || g.numa === numa);
    s.append(sv("text", { x: 4, y: y - 8, class: "muted" }, numa === null ? "GPUs" : `NUMA node ${numa}`));
    here.forEach((g, i) => {
      const x = gap + i * (W + gap);
      const held = (g.projects || []).length > 0;
      s.append(sv("rect", { class: "gpu" + (held ? " held" : ""), x, y, width: W, height: H, rx: 5, "data-gpu": g.id }));
      s.append(sv("text", { x: x + 8, y: y + 18 }, `GPU ${g.index}`));
      s.append(sv("text", { x: x + 8, y: y + 33 }, (g.model || "").slice(0, 20)));
      s.append(sv("text", { x: x + 8, y: y + 47 }, held ? g.projects.join(", ").slice(0, 20) : (g.drained ? "drained" : "free")));
      byPCI.set(g.pci, { x: x + W / 2, y });
    });
    const nics = n.nics.filter(c => numas.length === 1 || c.numa === numa);
    nics.forEach((c, i) => {
      const x = gap + i * (W / 1.3 + gap / 2);
      const ny = y + H + 60;
      s.append(sv("rect", { class: "box nic", x, y: ny, width: W / 1.3, height: 26, rx: 3 }));
      s.append(sv("text", { x: x + 6, y: ny + 17 }, c.name || c.pci));
    });
  });
  // Links through the NVSwitches: one line from each GPU up to the
  // switches, labelled once per GPU; other links between their ends.
  const viaSwitch = new Map();
  // Many alike links (a full xGMI or NVLink mesh) get one caption, not a
  // label each.
  const alike = new Map();
  for (const l of n.links) if (!l.via_switch && l.B !== "host") alike.set(l.label, (alike.get(l.label) || 0) + 1);
  let captions = 0;
  for (const [label, count] of alike) {
    if (count < 4) continue;
    s.append(sv("text", { x: gap, y: height - 14 - 13 * captions++, class: "link-label" }, `${count} GPU pairs: ${label}`));
  }
  let k = 0;
  for (const l of n.links) {
    if (l.via_switch) {
      for (const end of [l.A, l.B]) if (!viaSwitch.has(end)) viaSwitch.set(end, l);
      continue;
    }
    if (l.B !== "host" && alike.get(l.label) >= 4) {
      const a = byPCI.get(l.A), b = byPCI.get(l.B);
      if (a && b) s.append(sv("line", { x1: a.x, y1: a.y + H / 2, x2: b.x, y2: b.y + H / 2, class: l.kind + " mesh" }));
      continue;
    }
    const a = byPCI.get(l.A), b = l.B === "host" ? null : byPCI.get(l.B);
    if (!a) continue;
    const to = b || { x: a.x, y: a.y + H + 40 };
    const from = b ? a : { x: a.x, y: a.y + H };
    const cls = [l.kind, l.degraded ? "degraded" : ""].join(" ").trim();
    s.append(sv("line", { x1: from.x, y1: from.y, x2: to.x, y2: to.y, class: cls }));
    const mx = (from.x + to.x) / 2 + 4, my = (from.y + to.y) / 2 - 3 + (k++ % 3) * 11;
    s.append(sv("text", { x: mx, y: my, class: "link-label" }, l.label + (l.degraded ? " (degraded)" : "")));
  }
  let labelled = false;
  for (const [end, l] of viaSwitch) {
    const a = byPCI.get(end);
    if (!a || !n.switches.length) continue;
    const top = switchY + 30;
    // Under the boxes: a line from the lower row passes behind the upper.
    s.insertBefore(sv("line", { x1: a.x - 6, y1: a.y, x2: a.x - 6, y2: top, class: l.kind }), s.firstChild);
    if (!labelled) {
      // Every GPU's link into the fabric is alike: one label says it.
      s.append(sv("text", { x: gap, y: top + 16, class: "link-label" }, "each GPU: " + l.label));
      labelled = true;
    }
  }
  return s;
}

// sparkline draws a GPU's recent utilisation (0 to 100) as a small line.
function sparkline(vals) {
  const W = 120, H = 22;
  const s = sv("svg", { class: "spark", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  if (!vals || !vals.length) return s;
  const n = Math.max(vals.length - 1, 1);
  const pts = vals.map((v, i) => `${(i / n) * (W - 4) + 2},${H - 2 - Math.min(100, Math.max(0, v)) / 100 * (H - 4)}`);
  if (pts.length === 1) pts.push(`${W - 2},${pts[0].split(",")[1]}`);
  s.append(sv("polyline", { points: pts.join(" "), class: "series" }));
  return s;
}

// heldBy names who holds a GPU, each lease the viewer may see linked.
function heldBy(g) {
  if (!(g.projects || []).length) return [g.drained ? "drained" : "free"];
  const out = [(g.projects || []).join(", ")];
  for (const l of g.leases || []) out.push(" ", el("a", { href: "/ui/leases/" + encodeURIComponent(l), text: l }));
  return out;
}

function gib(b) { return `${Math.round(b / 2 ** 30 * 10) / 10} GiB`; }

async function lease(id) {
  const v = await get("/ui/api/leases/" + encodeURIComponent(id));
  const l = v.lease;
  const when = (t) => t ? new Date(t).toLocaleString() : "";
  const facts = el("table", { id: "lease" }, el("tbody", {},
    ...[["State", l.state + (l.reason ? ": " + l.reason : "")], ["Project", l.project], ["User", l.user],
      ["Asks for", `${l.request.gpus || 0} GPUs`], ["Created", when(l.created_at)], ["Granted", when(l.granted_at)],
      ["Ends", when(l.ends_at)], ["Ended", when(l.ended_at)], ["Queue position", l.queue_position || ""]]
      .filter(r => r[1] !== "" && r[1] !== undefined)
      .map(r => el("tr", {}, el("th", { text: r[0] }), el("td", { text: String(r[1]) })))));
  const alloc = el("ul", { id: "allocations" });
  for (const a of l.allocations || []) {
    alloc.append(el("li", {}, el("a", { href: "/ui/nodes/" + encodeURIComponent(a.node), text: a.node }), ": ",
      (a.devices || []).map(d => `${d.id}${d.model ? " (" + d.model + ")" : ""}`).join(", ")));
  }
  const jobs = el("tbody");
  for (const j of v.jobs) {
    for (const t of j.tasks && j.tasks.length ? j.tasks : [{}]) {
      const u = t.gpu;
      jobs.append(el("tr", { "data-job": j.id },
        el("td", { text: j.id }), el("td", { text: j.state }), el("td", { text: t.node || "" }),
        el("td", { class: "num", text: t.exit_code ?? j.exit_code ?? "" }),
        el("td", { class: "num", "data-col": "peak", text: u ? gib(u.peak_memory_bytes) : "" }),
        el("td", { class: "num", "data-col": "sm", text: u && u.mean_sm_percent !== undefined ? `${Math.round(u.mean_sm_percent)}%` : "" }),
        el("td", { text: j.reason || t.reason || "" })));
    }
  }
  main.replaceChildren(el("h1", { text: `Lease ${l.id}` }), facts,
    el("h2", { text: "GPUs" }), (l.allocations || []).length ? alloc : el("p", { class: "muted", text: "None held." }),
    el("h2", { text: "Jobs" }), el("table", { id: "jobs" },
      el("thead", {}, el("tr", {}, ...["Job", "State", "Node", "Exit", "Peak GPU memory", "Mean SM use", "Why"].map(h => el("th", { text: h })))), jobs));
}

async function node(id) {
  const n = await get("/ui/api/nodes/" + encodeURIComponent(id));
  const rows = el("tbody");
  for (const g of n.gpus) {
    rows.append(el("tr", { "data-gpu": g.id },
      el("td", {}, g.parent ? `${g.parent} / ${g.mig}` : el("a", { href: `/ui/nodes/${encodeURIComponent(n.id)}/gpus/${g.index}`, text: `GPU ${g.index}` })),
      el("td", { text: g.model || "" }),
      el("td", { text: g.pci || "" }), el("td", { text: g.numa ?? "" }),
      el("td", {}, ...heldBy(g)),
      el("td", { class: "num", text: g.utilization === undefined || g.utilization === null ? "unknown" : `${g.utilization}%` }),
      el("td", { class: "num", "data-col": "procs", text: g.processes === undefined || g.processes === null ? "" : g.processes }),
      el("td", {}, sparkline((n.recent || {})[g.index]))));
  }
  const finds = el("div", { id: "findings" });
  for (const f of n.finding_list || []) {
    finds.append(el("div", { class: "finding sev-" + f.severity, "data-finding": f.id },
      el("div", {}, el("strong", { text: f.severity + ": " }), f.title),
      f.remedy ? el("div", { class: "remedy" }, el("em", { text: "Fix: " }), f.remedy) : null));
  }
  if (!(n.finding_list || []).length) finds.append(el("p", { class: "muted", text: "No findings." }));
  main.replaceChildren(
    el("h1", { text: `Node ${n.id}` }),
    el("p", { class: "muted", text: `${n.state}${n.recorded ? ", recorded machine" : ""}; driver ${n.driver || "unknown"}, CUDA ${n.cuda || "unknown"}; last seen ${ago(n.last_seen)}` }),
    topology(n),
    el("h2", { text: "GPUs" }),
    el("table", { id: "gpus" }, el("thead", {}, el("tr", {}, ...["GPU", "Model", "PCI", "NUMA", "Held by", "Utilisation", "Processes", "Last 15 min"].map(h => el("th", { text: h })))), rows),
    el("h2", { text: "Findings" }), finds);
}

// chart draws one reading's hour as a line.
function chart(title, points, key, max, unit) {
  const W = 560, H = 120, pad = 30;
  const s = sv("svg", { class: "chart", width: W, height: H + 30, viewBox: `0 0 ${W} ${H + 30}`, "data-chart": key });
  s.append(sv("text", { x: 4, y: 12 }, title));
  const pts = points.filter(p => p[key] !== undefined && p[key] !== null);
  if (!pts.length) {
    s.append(sv("text", { x: pad, y: H / 2 + 15, class: "muted" }, "no reading"));
    return s;
  }
  const top = max || Math.max(...pts.map(p => p[key])) * 1.1 || 1;
  const t0 = pts[0].t, t1 = Math.max(pts[pts.length - 1].t, t0 + 1);
  const xy = pts.map(p => `${pad + (p.t - t0) / (t1 - t0) * (W - 2 * pad)},${18 + H - p[key] / top * H}`).join(" ");
  s.append(sv("line", { x1: pad, y1: 18 + H, x2: W - pad, y2: 18 + H }));
  s.append(sv("polyline", { points: xy, class: "series" }));
  const end = xy.split(" ").pop().split(",");
  s.append(sv("circle", { cx: end[0], cy: end[1], r: 3, class: "series-end" }));
  const last = pts[pts.length - 1][key];
  s.append(sv("text", { x: W - pad - 120, y: 12 }, `now ${Math.round(last * 10) / 10} ${unit}`));
  s.append(sv("text", { x: pad, y: H + 30, class: "muted" }, `${pts.length} points over ${Math.round((t1 - t0) / 60)} min`));
  return s;
}

async function gpu(nodeID, index) {
  const g = await get(`/ui/api/nodes/${encodeURIComponent(nodeID)}/gpus/${encodeURIComponent(index)}`);
  const pts = g.points.map(p => Object.assign({}, p, { mem: p.mem === undefined ? undefined : p.mem / 2 ** 30 }));
  main.replaceChildren(
    el("h1", {}, el("a", { href: "/ui/nodes/" + encodeURIComponent(g.node), text: g.node }), ` GPU ${g.gpu.index}`),
    el("p", { class: "muted", text: `${g.gpu.model || ""} ${g.gpu.pci_address || ""}; held by ${(g.gpu.leases || []).length} lease(s); one point every ${g.step_s} s, an hour kept` }),
    chart("Utilisation (%)", pts, "util", 100, "%"),
    chart("Memory used (GiB)", pts, "mem", g.gpu.memory_bytes ? g.gpu.memory_bytes / 2 ** 30 : 0, "GiB"),
    chart("Power (W)", pts, "power", 0, "W"),
    chart("Temperature (°C)", pts, "temp", 0, "°C"));
}

function route() {
  const p = location.pathname.replace(/^\/ui\/?/, "");
  const m = p.match(/^nodes\/([^/]+)\/gpus\/(\d+)$/);
  if (m) return () => gpu(decodeURIComponent(m[1]), m[2]);
  if (p.startsWith("leases/")) return () => lease(decodeURIComponent(p.slice(7)));
  if (p.startsWith("nodes/")) return () => node(decodeURIComponent(p.slice(6)));
  if (p === "queue") return queue;
  if (p === "projects") return projects;
  return fleet;
}

let drawing = false, again = false;
async function draw() {
  if (drawing) { again = true; return; }
  drawing = true;
  try {
    await route()();
    document.body.dataset.drawn = String(Date.now());
  } catch (e) {
    main.replaceChildren(el("p", { class: "sev-critical", text: String(e.message || e) }));
  } finally {
    drawing = false;
    if (again) { again = false; draw(); }
  }
}

function live() {
  const ind = document.getElementById("live");
  const es = new EventSource("/ui/api/events");
  es.onopen = () => { ind.textContent = "live"; ind.classList.add("on"); };
  es.onerror = () => { ind.textContent = "reconnecting"; ind.classList.remove("on"); };
  es.addEventListener("change", draw);
}

draw();
live();
