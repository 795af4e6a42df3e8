// The browser chat page of imgw (served by `imgw serve --ws-listen` at /), on the
// imgw-client bundle next to it. No framework and nothing from other hosts: the
// gateway's Content-Security-Policy lets this page run only its own files and talk only
// to its own listener. What it offers follows `imgw chat`: a p2p chat or a group (new,
// or by conv_id), recent history, read receipts, typing, and the connection's state
// (lost, back, how many missed messages the catch-up brought).

import {
  Client,
  DEV_KEY,
  MsgType,
  decodeMediaContent,
  decodeSystemContent,
  mintToken,
  recalledSeq,
  toId,
} from "./imgw-client.js";

const HISTORY = 20; // messages shown when a conversation opens
const OWN_KEPT = 200; // own messages whose receipts are kept up to date
const TYPING_EVERY_MS = 2000; // a TYPING at most this often while typing
const TYPING_SHOWN_MS = 4000; // "N is typing…" lasts this long after the last one
const PENDING_AFTER_MS = 500; // a message not acked by then is shown as pending
const TITLE_BYTES = 256;

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  login: $("login"),
  loginForm: $("login-form"),
  uid: $("uid"),
  device: $("device"),
  loginError: $("login-error"),
  session: $("session"),
  who: $("who"),
  leave: $("leave"),
  open: $("open"),
  p2pForm: $("p2p-form"),
  peer: $("peer"),
  groupForm: $("group-form"),
  groupTitle: $("group-title"),
  groupMembers: $("group-members"),
  joinForm: $("join-form"),
  groupId: $("group-id"),
  openError: $("open-error"),
  elsewhereTitle: $("elsewhere-title"),
  elsewhere: $("elsewhere"),
  chat: $("chat"),
  convName: $("conv-name"),
  convId: $("conv-id"),
  messages: $("messages"),
  typing: $("typing"),
  composer: $("composer"),
  compose: $("compose"),
};

/** @type {Client | null} */
let client = null;
let me = 0n; // the signed-in uid
let lost = false; // the connection is down, as last shown
let conv = null; // the open conversation (see newConv)
const elsewhere = new Map(); // convId -> {li, count, label}: news in other conversations

// -- small helpers ----------------------------------------------------------------------

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  if (text) node.textContent = text;
  return node;
}

function clock(ms) {
  const d = new Date(ms);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

function randomHex(bytes) {
  const b = new Uint8Array(bytes);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

function errorText(e) {
  return e instanceof Error ? e.message : String(e);
}

function parseId(text, what) {
  const value = text.trim();
  if (!/^[0-9]{1,20}$/.test(value)) throw new TypeError(`${what} must be a positive whole number`);
  return toId(value, what);
}

function parseUids(text) {
  const uids = text.split(/[\s,]+/).filter(Boolean).map((u) => parseId(u, "each member"));
  return [...new Set(uids)];
}

function list(items) {
  const names = items.map(String);
  if (names.length <= 1) return names.join("");
  return `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]}`;
}

function defaultDevice() {
  // One per tab, kept across reloads of it: a second tab is a second device.
  let device = sessionStorage.getItem("imgw.device");
  if (!device) {
    device = `web-${randomHex(3)}`;
    sessionStorage.setItem("imgw.device", device);
  }
  return device;
}

function setStatus(state, text) {
  ui.status.dataset.state = state;
  ui.status.textContent = text;
}

// -- signing in and out -----------------------------------------------------------------

async function signIn() {
  ui.loginError.textContent = "";
  let uid;
  try {
    uid = parseId(ui.uid.value, "uid");
  } catch (e) {
    ui.loginError.textContent = errorText(e);
    ui.uid.focus();
    return;
  }
  const device = ui.device.value.trim() || ui.device.placeholder;
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(device)) {
    ui.loginError.textContent = "device: 1 to 32 letters, digits, _ or -";
    ui.device.focus();
    return;
  }
  const c = new Client({
    url: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`,
    uid,
    device,
    // A fresh development token for each login, as `imgw chat` mints its own.
    token: (who) => mintToken({ key: DEV_KEY, uid: who.uid, device: who.device }),
  });
  c.on("state", (s) => client === c && onState(s));
  c.on("message", (m) => client === c && onMessage(m));
  c.on("read", (r) => client === c && onRead(r));
  c.on("typing", (t) => client === c && onTyping(t));
  c.on("kick", (k) => client === c && note(`disconnected by the server (${k.reasonName}${k.text ? `: ${k.text}` : ""})`));
  c.on("error", (e) => client === c && note(`server error: ${e.text}`));
  c.on("notice", (n) => client === c && note(`notice from the server: ${new TextDecoder().decode(n.content)}`));
  client = c;
  me = uid;
  lost = false;
  conv = null;
  ui.chat.hidden = true;
  for (const id of [...elsewhere.keys()]) dropElsewhere(id);
  ui.loginForm.querySelector("button").disabled = true;
  try {
    const ok = await c.connect();
    ui.who.textContent = `uid ${uid}, device ${device}, on node ${ok.node}`;
    ui.login.hidden = true;
    ui.session.hidden = false;
    ui.open.hidden = false;
    ui.peer.focus();
  } catch (e) {
    if (client === c) client = null;
    ui.loginError.textContent = `cannot sign in: ${errorText(e)}`;
  } finally {
    ui.loginForm.querySelector("button").disabled = false;
  }
}

function signedOut(reason) {
  client = null;
  ui.login.hidden = false;
  ui.session.hidden = true;
  ui.open.hidden = true;
  ui.compose.disabled = true;
  ui.composer.querySelector("button").disabled = true;
  if (reason) ui.loginError.textContent = reason;
  for (const timer of conv?.typers.values() ?? []) clearTimeout(timer);
  conv?.typers.clear();
  showTyping();
}

function onState(s) {
  switch (s.state) {
    case "connecting":
      if (s.attempt === 0) setStatus("connecting", "connecting…");
      else setStatus("lost", "connection lost — reconnecting…");
      break;
    case "online":
      if (s.reconnected) {
        setStatus("catching-up", "reconnected — catching up…");
        note(`reconnected to ${s.node}; catching up`);
        flushRead(); // a READ that could not go while offline
      } else {
        setStatus("online", "online");
      }
      break;
    case "offline":
      setStatus("lost", "connection lost — reconnecting…");
      if (!lost) note("connection to the gateway lost; reconnecting");
      lost = true;
      break;
    case "back": {
      lost = false;
      const n = s.caughtUp;
      setStatus("back", `back — ${n} caught up`);
      note(`back: ${n} missed message${n === 1 ? "" : "s"} caught up`);
      break;
    }
    case "closed": {
      const why = s.reason === "client closed" ? "signed out" : s.reason;
      setStatus("closed", why);
      note(why);
      lost = false;
      signedOut(why === "signed out" ? "" : why);
      break;
    }
  }
}

// -- opening conversations ----------------------------------------------------------------

function newConv(id, name) {
  return {
    id,
    name,
    rows: new Map(), // seq -> <li> of each message shown
    own: [], // seqs of own messages, oldest first (at most OWN_KEPT)
    pending: new Map(), // client_msg_id -> <li> of own messages not acked yet
    readers: new Map(), // uid -> seq read up to (READ_NOTIFY)
    typers: new Map(), // uid -> timer that ends "is typing"
    lastShown: 0n, // the highest seq of others' messages shown: what READ marks
    readSent: 0n,
    lastTyping: -Infinity,
    loading: true, // its history is on the way: one READ once it is shown
  };
}

async function openConversation(id, name) {
  const c = client;
  if (c === null) return;
  for (const timer of conv?.typers.values() ?? []) clearTimeout(timer);
  const opened = newConv(id, name);
  conv = opened;
  ui.convName.textContent = name;
  ui.convId.textContent = String(id);
  ui.messages.replaceChildren();
  showTyping();
  ui.chat.hidden = false;
  ui.compose.disabled = false;
  ui.composer.querySelector("button").disabled = false;
  dropElsewhere(id);
  ui.messages.setAttribute("aria-busy", "true");
  try {
    const page = await c.history(id, { limit: HISTORY });
    if (conv !== opened) return;
    c.markSeen(id, page.messages.map((m) => m.seq));
    for (const m of page.messages) show(m);
    if (page.hasMore) ui.messages.prepend(el("li", { class: "note" }, `earlier messages are not shown`));
  } catch (e) {
    if (conv === opened) note(`no history: ${errorText(e)}`);
  } finally {
    opened.loading = false;
    if (conv === opened) ui.messages.removeAttribute("aria-busy");
  }
  flushRead();
  ui.compose.focus();
}

async function openFrom(form, action) {
  ui.openError.textContent = "";
  const button = form.querySelector("button");
  button.disabled = true;
  try {
    const [id, name] = await action();
    await openConversation(id, name);
  } catch (e) {
    ui.openError.textContent = errorText(e);
  } finally {
    button.disabled = false;
  }
}

function openP2P() {
  return openFrom(ui.p2pForm, async () => {
    const peer = parseId(ui.peer.value, "peer uid");
    if (peer === me) throw new TypeError("that is you: pick another uid");
    return [await client.openP2P(peer), `chat with ${peer}`];
  });
}

function createGroup() {
  return openFrom(ui.groupForm, async () => {
    const title = ui.groupTitle.value.trim();
    if (!title) throw new TypeError("give the group a title");
    if (new TextEncoder().encode(title).length > TITLE_BYTES) throw new TypeError(`a title is at most ${TITLE_BYTES} bytes`);
    const uids = parseUids(ui.groupMembers.value).filter((u) => u !== me);
    if (uids.length === 0) throw new TypeError("name the other members: uids, comma-separated");
    const id = await client.groupCreate(title, uids);
    ui.groupId.value = String(id);
    return [id, `group "${title}"`];
  });
}

function openGroup() {
  return openFrom(ui.joinForm, async () => {
    const id = parseId(ui.groupId.value, "conv_id");
    const info = await client.groupInfo(id);
    return [id, `group "${info.title}"`];
  });
}

// -- messages ---------------------------------------------------------------------------

function systemText(m) {
  const ev = decodeSystemContent(m.content);
  if (ev === null) return "(unreadable system message)";
  const who = list(ev.uids);
  switch (ev.event) {
    case "created":
      return `${ev.by} created "${ev.title ?? ""}" with ${list(ev.uids.filter((u) => u !== ev.by))}`;
    case "added":
      return `${ev.by} added ${who}`;
    case "removed":
      return `${ev.by} removed ${who}`;
    case "left":
      return `${who} left`;
    case "titled":
      return `${ev.by} renamed the group "${ev.title ?? ""}"`;
    case "notice":
      return `notice: ${ev.text ?? ""}`;
    default:
      return ev.event;
  }
}

const MEDIA = { [MsgType.IMAGE]: "image", [MsgType.VOICE]: "voice", [MsgType.FILE]: "file" };

/** What a message says, as text: [kind, text]. */
function describe(m) {
  if (m.msgType === MsgType.TEXT) return ["text", m.text ?? ""];
  if (m.msgType === MsgType.SYSTEM) return ["system", systemText(m)];
  if (m.msgType === MsgType.RECALL) {
    if (m.content.length === 0) return ["recalled", "(recalled)"];
    const seq = recalledSeq(m.content);
    return ["system", seq === null ? "a message was recalled" : `message ${seq} recalled`];
  }
  const label = MEDIA[m.msgType];
  if (label !== undefined) {
    const media = decodeMediaContent(m.content);
    const what = media === null ? new TextDecoder().decode(m.content) : `${media.name ?? media.key}`;
    return ["media", `[${label}] ${what}`];
  }
  return ["other", `[type ${m.msgType}, ${m.content.length} bytes]`];
}

function messageRow({ seq, sender, serverMs, kind, text, own }) {
  const li = el("li", { class: `msg ${kind} ${own ? "own" : "other"}`, "data-testid": "message" });
  if (seq !== null) li.dataset.seq = String(seq);
  li.dataset.sender = String(sender);
  const meta = el("div", { class: "meta" });
  if (sender !== 0n) meta.append(el("span", { class: "who", "data-testid": "message-sender" }, own ? "you" : String(sender)));
  const time = el("time", { datetime: new Date(serverMs).toISOString() }, clock(serverMs));
  meta.append(time);
  li.append(meta, el("p", { class: "text", "data-testid": "message-text" }, text));
  if (own) li.append(el("p", { class: "receipt", "data-testid": "receipt" }));
  return li;
}

/** Put `li` (message `seq`) after the last row with a lower seq and after the notes
 * that follow it; own messages not acked yet (no seq) stay last. */
function place(li, seq) {
  let before = null;
  for (let node = ui.messages.lastElementChild; node !== null; node = node.previousElementSibling) {
    if (node === li) continue;
    const at = node.dataset.seq;
    if (at === undefined) {
      if (node.classList.contains("pending")) before = node;
      continue;
    }
    if (BigInt(at) < seq) break;
    before = node;
  }
  if (li.parentElement !== ui.messages || li.nextElementSibling !== before) ui.messages.insertBefore(li, before);
}

/** Show one message of the open conversation, once. */
function show(m) {
  const c = conv;
  if (c === null || m.convId !== c.id || c.rows.has(m.seq)) return;
  const own = m.senderUid === me;
  const early = own && m.clientMsgId ? c.pending.get(m.clientMsgId) : undefined;
  if (early !== undefined) {
    acked(c, early, m.clientMsgId, m.seq, m.serverMs); // came back before its ack
    return;
  }
  const [kind, text] = describe(m);
  const li = messageRow({ seq: m.seq, sender: m.senderUid, serverMs: m.serverMs, kind, text, own });
  c.rows.set(m.seq, li);
  place(li, m.seq);
  li.scrollIntoView({ block: "nearest" });
  if (m.msgType === MsgType.RECALL && m.content.length > 0) {
    const target = c.rows.get(recalledSeq(m.content) ?? -1n);
    target?.classList.add("recalled");
    target?.querySelector(".text")?.replaceChildren("(recalled)");
  }
  if (own) {
    keepOwn(c, m.seq);
    li.querySelector(".receipt").textContent = "sent";
    receipts(c);
  } else {
    if (m.seq > c.lastShown) c.lastShown = m.seq;
    if (m.senderUid !== 0n) stopTyping(c, m.senderUid);
    flushRead();
  }
}

function keepOwn(c, seq) {
  c.own.push(seq);
  c.own.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  if (c.own.length > OWN_KEPT) c.own.shift();
}

function onMessage(m) {
  if (conv !== null && m.convId === conv.id) show(m);
  else news(m);
}

/** READ what is shown: cumulative, so the highest seq shown is enough. Sent while the
 * page is visible; what could not go goes on the next chance. */
function flushRead() {
  const c = conv;
  if (client === null || c === null || c.loading || document.visibilityState !== "visible") return;
  if (c.lastShown > c.readSent && client.read(c.id, c.lastShown)) c.readSent = c.lastShown;
}

// -- sending ----------------------------------------------------------------------------

function send(text) {
  const c = conv;
  const session = client;
  if (c === null || session === null) return;
  const cmid = randomHex(16);
  const li = messageRow({ seq: null, sender: me, serverMs: Date.now(), kind: "text", text, own: true });
  li.classList.add("pending");
  const receipt = li.querySelector(".receipt");
  receipt.textContent = "sending…";
  c.pending.set(cmid, li);
  ui.messages.append(li);
  li.scrollIntoView({ block: "nearest" });
  c.lastTyping = -Infinity; // typing again is news
  attempt(c, session, li, cmid, text);
}

function attempt(c, session, li, cmid, text) {
  const receipt = li.querySelector(".receipt");
  const slow = setTimeout(() => (receipt.textContent = "pending: sent once the gateway acks it"), session.connected ? PENDING_AFTER_MS : 0);
  session.send(c.id, text, { clientMsgId: cmid }).then(
    (ack) => {
      clearTimeout(slow);
      acked(c, li, cmid, ack.seq, ack.serverMs);
    },
    (e) => {
      clearTimeout(slow);
      if (c.pending.get(cmid) !== li) return;
      receipt.replaceChildren(`not sent: ${errorText(e)} `);
      if (client === session) {
        const retry = el("button", { type: "button", class: "link", "data-testid": "retry" }, "retry");
        retry.addEventListener("click", () => {
          receipt.textContent = "sending…";
          attempt(c, session, li, cmid, text); // the same client_msg_id: stored at most once
        });
        receipt.append(retry);
      }
    },
  );
}

function acked(c, li, cmid, seq, serverMs) {
  if (c.pending.get(cmid) !== li) return;
  c.pending.delete(cmid);
  li.classList.remove("pending");
  if (c.rows.has(seq)) {
    li.remove(); // shown already
    return;
  }
  li.dataset.seq = String(seq);
  const time = li.querySelector("time");
  time.dateTime = new Date(serverMs).toISOString();
  time.textContent = clock(serverMs);
  c.rows.set(seq, li);
  keepOwn(c, seq);
  if (c === conv) place(li, seq);
  li.querySelector(".receipt").textContent = "sent";
  receipts(c);
}

// -- receipts and typing ------------------------------------------------------------------

function onRead(r) {
  const c = conv;
  if (c === null || r.convId !== c.id || r.readerUid === me) return;
  if (r.seq <= (c.readers.get(r.readerUid) ?? 0n)) return;
  c.readers.set(r.readerUid, r.seq);
  receipts(c);
}

/** "read by 2, 3" on each own message the others have read. */
function receipts(c) {
  const readers = [...c.readers].sort((a, b) => (a[0] < b[0] ? -1 : 1));
  for (const seq of c.own) {
    const li = c.rows.get(seq);
    if (li === undefined) continue;
    const by = readers.filter(([, upto]) => upto >= seq).map(([uid]) => uid);
    const receipt = li.querySelector(".receipt");
    const text = by.length ? `read by ${by.join(", ")}` : "sent";
    if (receipt.textContent !== text) receipt.textContent = text;
    li.classList.toggle("read", by.length > 0);
  }
}

function typed() {
  const c = conv;
  if (client === null || c === null || !ui.compose.value.trim()) return;
  const now = performance.now();
  if (now - c.lastTyping >= TYPING_EVERY_MS && client.typing(c.id)) c.lastTyping = now;
}

function onTyping(t) {
  const c = conv;
  if (c === null || t.convId !== c.id || t.uid === me) return;
  clearTimeout(c.typers.get(t.uid));
  c.typers.set(
    t.uid,
    setTimeout(() => stopTyping(c, t.uid), TYPING_SHOWN_MS),
  );
  showTyping();
}

function stopTyping(c, uid) {
  if (!c.typers.has(uid)) return;
  clearTimeout(c.typers.get(uid));
  c.typers.delete(uid);
  if (c === conv) showTyping();
}

function showTyping() {
  const uids = conv === null ? [] : [...conv.typers.keys()].sort((a, b) => (a < b ? -1 : 1));
  const text = uids.length === 0 ? "" : `${list(uids)} ${uids.length === 1 ? "is" : "are"} typing…`;
  if (ui.typing.textContent !== text) ui.typing.textContent = text;
}

// -- notes and news from other conversations ------------------------------------------------

/** A line about the connection or the session in the open conversation. */
function note(text) {
  if (conv === null) return;
  const li = el("li", { class: "note", "data-testid": "note" });
  li.append(el("time", { datetime: new Date().toISOString() }, clock(Date.now())), ` ${text}`);
  ui.messages.append(li);
  li.scrollIntoView({ block: "nearest" });
}

/** A message in a conversation that is not open: a line to open it from. */
function news(m) {
  if (m.senderUid === me) return; // from another device of yours
  let entry = elsewhere.get(m.convId);
  if (entry === undefined) {
    const li = el("li");
    const button = el("button", { type: "button", class: "link", "data-testid": "elsewhere-open" });
    li.append(button);
    entry = { li, button, count: 0, name: `conversation ${m.convId}`, from: new Set(), event: "" };
    const opened = entry;
    button.addEventListener("click", () => openConversation(m.convId, opened.name));
    elsewhere.set(m.convId, entry);
    ui.elsewhere.append(li);
    ui.elsewhereTitle.hidden = false;
  }
  if (m.msgType === MsgType.SYSTEM) {
    const ev = decodeSystemContent(m.content);
    if (ev?.title !== undefined) entry.name = `group "${ev.title}"`;
    entry.event = systemText(m);
  } else {
    entry.count += 1;
    entry.from.add(m.senderUid);
  }
  const what = entry.count ? `${entry.count} new from ${list([...entry.from])}` : entry.event;
  entry.button.textContent = `${entry.name} (${m.convId}): ${what}`;
}

function dropElsewhere(id) {
  const entry = elsewhere.get(id);
  if (entry === undefined) return;
  entry.li.remove();
  elsewhere.delete(id);
  ui.elsewhereTitle.hidden = elsewhere.size === 0;
}

// -- wiring -------------------------------------------------------------------------------

function onSubmit(form, action) {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    void action();
  });
}

ui.device.placeholder = defaultDevice();
onSubmit(ui.loginForm, signIn);
onSubmit(ui.p2pForm, openP2P);
onSubmit(ui.groupForm, createGroup);
onSubmit(ui.joinForm, openGroup);
onSubmit(ui.composer, async () => {
  const text = ui.compose.value;
  if (!text.trim()) return;
  ui.compose.value = "";
  send(text);
});
ui.compose.addEventListener("input", typed);
ui.leave.addEventListener("click", () => {
  const c = client;
  if (c !== null) void c.logout().catch(() => c.close());
});
document.addEventListener("visibilitychange", flushRead);
document.body.dataset.ready = "true";
