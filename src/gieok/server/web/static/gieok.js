// gieok dashboard: the overview's latency chart, and the live page (event feed over the
// WebSocket with resume, turn-timings chart). No inline scripts (the CSP forbids them), no
// innerHTML with event data: text goes in through textContent.
"use strict";

(function () {
  const PALETTE = ["#2456c9", "#8a3ffc", "#00897b", "#e07b00", "#c2185b", "#6d7c99"];

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fitChart(plot, box) {
    const resize = () => plot.setSize({ width: Math.max(200, box.clientWidth), height: 220 });
    if (window.ResizeObserver) new ResizeObserver(resize).observe(box);
    resize();
  }

  // -- overview: search latency over the last searches ------------------------------------------
  function latencyChart() {
    const box = document.getElementById("latency-chart");
    const data = document.getElementById("latency-data");
    if (!box || !data || !window.uPlot) return;
    const rows = JSON.parse(data.textContent);
    const xs = rows.map((r, i) => i + 1);
    const ys = rows.map((r) => r.ms);
    const plot = new window.uPlot({
      width: Math.max(200, box.clientWidth), height: 220,
      scales: { x: { time: false } },
      axes: [{ label: "search (oldest → newest)", incrs: [1, 2, 5, 10, 20, 50, 100, 200] }, { label: "ms" }],
      series: [{ label: "search" }, { label: "search time (ms)", stroke: PALETTE[0], width: 2, points: { size: 4 } }],
    }, [xs, ys], box);
    fitChart(plot, box);
  }

  // -- live: the event feed -----------------------------------------------------------------------
  const MAX_ITEMS = 500;
  const TIMINGS = [["stage1_ms", "stage 1"], ["stage2_ms", "stage 2"], ["recall_ms", "recall"],
    ["first_token_ms", "first token"], ["generation_ms", "generation"]];

  function channelOf(e) {
    const d = e.data || {};
    if (d.channel) return String(d.channel);
    if (d.scope && d.scope.channel) return String(d.scope.channel);
    if (d.conversation && d.conversation.channel) return String(d.conversation.channel);
    if (d.block && d.block.scope && d.block.scope.channel) return String(d.block.scope.channel);
    if (Array.isArray(d.blocks) && d.blocks[0] && d.blocks[0].scope) return String(d.blocks[0].scope.channel || "");
    return "";
  }

  function ms(v) { return (Number(v) || 0).toFixed(1) + " ms"; }
  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

  // Events that say data was erased: the server's buffer holds what they name redacted, and this page,
  // which may show that data already, reads its feed again from there (coordination/events.py)
  const ERASURES = new Set(["memory.forgotten", "user.erased", "summary.withdrawn", "pipeline.message_deleted",
    "pipeline.message_edited"]);

  function describe(e) {
    const d = e.data || {};
    if (typeof d.redacted === "string") return "(redacted: " + d.redacted + ")";
    switch (e.type) {
      case "memory.added":
        return (d.blocks || []).slice(0, 3).map((b) => "#" + b.block_index + " " + b.text).join(" · ") +
          ((d.blocks || []).length > 3 ? " … (" + d.blocks.length + " blocks)" : "");
      case "memory.forgotten":
        return "forgot #" + (d.block_indices || []).join(", #");
      case "memory.promoted":
        return "from " + d.from + " (" + (d.reason || "") + "): " + ((d.block && d.block.text) || "");
      case "search.answered":
        // `found`: every hit of the answer; `hits` carries the best five only
        return "“" + d.query + "” → " + d.source + " in " + ms(d.search_time_ms) + ", " + plural(d.found ?? (d.hits || []).length, "hit");
      case "turn.timings":
        return TIMINGS.map(([k, label]) => label + " " + ms(d[k])).join(" · ");
      case "stream.gap":
        return "missed " + d.missed + " events: the buffer no longer reaches back that far";
      case "stream.lagged":
        return "this page fell behind; reconnecting";
      default:
        if (d.fact) return String(d.fact);
        if (d.text) return String(d.text);
        return JSON.stringify(d).slice(0, 240);
    }
  }

  function livePage() {
    const root = document.getElementById("live");
    if (!root) return;
    const feed = document.getElementById("feed");
    const status = document.getElementById("live-status");
    const typeFilter = document.getElementById("live-type");
    const channelFilter = document.getElementById("live-channel");
    const pause = document.getElementById("live-pause");
    let lastSeq = Number(root.dataset.since || 0);
    let retry = 0;
    let seenUpTo = lastSeq;  // the newest event handled: a replay's older ones are not charted or acted on twice
    let replayFrom = null;  // set when the feed is read again after an erasure
    let paused = false;
    let held = [];
    let socket = null;

    function setStatus(text, cls) {
      status.textContent = text;
      status.className = "status " + (cls || "");
    }

    function visible(item) {
      const type = typeFilter.value;
      const channel = channelFilter.value.trim().replace(/^#/, "");
      return (!type || item.dataset.type.startsWith(type)) && (!channel || item.dataset.channel === channel);
    }

    function applyFilters() {
      for (const item of feed.children) item.hidden = !visible(item);
    }

    function show(e) {
      const item = el("li");
      item.dataset.type = e.type;
      item.dataset.channel = channelOf(e);
      item.dataset.seq = String(e.seq);
      item.appendChild(el("span", "seq", e.seq ? "#" + e.seq : "–"));
      item.appendChild(el("span", "type type-" + e.type.split(".")[0], e.type));
      const when = new Date(e.time * 1000);
      const pad = (n) => String(n).padStart(2, "0");
      item.appendChild(el("time", "muted", pad(when.getHours()) + ":" + pad(when.getMinutes()) + ":" + pad(when.getSeconds()) +
        (item.dataset.channel ? "  #" + item.dataset.channel : "")));
      item.appendChild(el("span", "what", describe(e)));
      item.hidden = !visible(item);
      feed.insertBefore(item, feed.firstChild);  // newest on top
      while (feed.children.length > MAX_ITEMS) feed.removeChild(feed.lastChild);
    }

    // turn timings chart
    const chartBox = document.getElementById("timings-chart");
    const empty = document.getElementById("timings-empty");
    const turns = [];
    let plot = null;
    function chartTurn(e) {
      if (!chartBox || !window.uPlot) return;
      turns.push(e);
      if (turns.length > 100) turns.shift();
      const data = [turns.map((t) => t.time)].concat(TIMINGS.map(([k]) => turns.map((t) => Number(t.data[k]) || 0)));
      if (!plot) {
        empty.hidden = true;
        chartBox.hidden = false;
        plot = new window.uPlot({
          width: Math.max(200, chartBox.clientWidth), height: 220,
          axes: [{}, { label: "ms" }],
          series: [{}].concat(TIMINGS.map(([, label], i) => ({ label: label, stroke: PALETTE[i], width: 2, points: { size: 4 } }))),
        }, data, chartBox);
        fitChart(plot, chartBox);
      } else {
        plot.setData(data);
      }
    }

    function handle(e) {
      const fresh = !e.seq || e.seq > seenUpTo;
      if (e.seq) { lastSeq = Math.max(lastSeq, e.seq); seenUpTo = Math.max(seenUpTo, e.seq); }
      if (fresh && e.type === "turn.timings") chartTurn(e);
      if (paused) held.push(e); else show(e);
      if (fresh && ERASURES.has(e.type)) readAgain();
    }

    function readAgain() {
      // What this page shows (and holds while paused) may carry the erased words: it is dropped and
      // read again from the server's buffer, which holds those events redacted under the same ids.
      const shown = Array.from(feed.children).map((item) => Number(item.dataset.seq)).filter((seq) => seq > 0)
        .concat(held.map((e) => e.seq).filter((seq) => seq > 0));
      replayFrom = shown.length ? Math.min(...shown) - 1 : lastSeq;
      if (socket) socket.close();
    }

    function connect() {
      const scheme = location.protocol === "https:" ? "wss:" : "ws:";
      socket = new WebSocket(scheme + "//" + location.host + "/v1/events/ws?since=" + lastSeq);
      socket.onopen = () => { retry = 0; setStatus("connected · live", "connected"); };
      socket.onmessage = (message) => {
        let e;
        try { e = JSON.parse(message.data); } catch (err) { return; }
        handle(e);
        setStatus("connected · last event #" + lastSeq, "connected");
      };
      socket.onclose = (event) => {
        if (replayFrom !== null && event.code !== 4401 && event.code !== 4403) {
          lastSeq = replayFrom;
          replayFrom = null;
          feed.textContent = "";
          held = [];
          connect();
          return;
        }
        if (event.code === 4401 || event.code === 4403) {
          setStatus("the session ended: log in again", "down");
          return;
        }
        retry = Math.min(retry + 1, 6);
        const wait = Math.min(10, 0.5 * Math.pow(2, retry));
        setStatus("disconnected: reconnecting in " + wait.toFixed(0) + " s (resuming after #" + lastSeq + ")", "down");
        setTimeout(connect, wait * 1000);
      };
    }

    typeFilter.addEventListener("change", applyFilters);
    channelFilter.addEventListener("input", applyFilters);
    pause.addEventListener("click", () => {
      paused = !paused;
      pause.setAttribute("aria-pressed", String(paused));
      pause.textContent = paused ? "Resume" : "Pause";
      if (!paused) { held.forEach(show); held = []; }
    });
    document.getElementById("live-filters").addEventListener("submit", (ev) => ev.preventDefault());
    // For tests and the curious: drop the connection (it resumes after the last event seen).
    root.gieokLive = { drop: () => socket && socket.close(), lastSeq: () => lastSeq };
    connect();
  }

  function start() {
    latencyChart();
    livePage();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
