/// The live page that `GET /` serves: plain HTML, CSS and JavaScript, no external resources.
///
/// It subscribes to `/feed?topic=NAME` on the same host (reconnecting with backoff, and with
/// `since` and `epoch` so that the server sends what it missed: #status then reads `recovered`,
/// or `resync` when the server could not, and #recovery says which messages or why), shows
/// the topic, the connection's status, the `online` count, the `gap` frames and the last
/// 100 messages (newest first), and publishes what is typed with `POST /publish?topic=NAME`.
/// The topic is `feed` unless the page's URL says `?topic=NAME`; the topic box switches it
/// (checked against `[a-z0-9_-]{1,48}` first, as the server does), which reconnects and
/// clears the list.
/// `Examples/clients/browser_check.py` drives it in headless Chromium by these ids:
/// `status`, `online`, `gaps`, `messages`, `publish-text`, `publish-button`, `topic`,
/// `topic-button`, `topic-error`, `current-topic`, `recovery`.
enum LivePage {
    static let html: String = #"""
    <!doctype html>
    <html lang="en">
    <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <title>Live feed · AsyncBroadcast</title>
    <link rel="icon" href="data:,">
    <style>
      :root { color-scheme: light dark; --muted: #8a8f98; --line: #8a8f9833; --accent: #2f6fdb; }
      body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }
      h1 { font-size: 1.25rem; margin: 0 0 .75rem; }
      .bar { display: flex; flex-wrap: wrap; gap: .5rem 1.5rem; color: var(--muted); margin-bottom: 1rem; }
      .bar span span { color: CanvasText; font-weight: 600; }
      #status[data-state="ready"] { color: #1f9d55; }
      #status[data-state="closed"] { color: #d64545; }
      #status[data-state="resync"] { color: #d08a00; }
      #status[data-state="recovered"] { color: #1f9d55; }
      #recovery { color: var(--muted); font-size: .85rem; min-height: 1.2em; margin: -.6rem 0 .8rem; }
      form { display: flex; gap: .5rem; margin-bottom: .4rem; }
      input { flex: 1; padding: .5rem .7rem; border: 1px solid var(--line); border-radius: 8px; font: inherit; }
      button { padding: .5rem 1.1rem; border: 0; border-radius: 8px; background: var(--accent); color: #fff; font: inherit; cursor: pointer; }
      button:disabled { opacity: .6; cursor: default; }
      #publish-result { color: var(--muted); font-size: .85rem; min-height: 1.2em; margin-bottom: 1rem; }
      #topic-form input { flex: 0 1 16rem; }
      #topic-form label { align-self: center; color: var(--muted); }
      #topic[aria-invalid="true"] { border-color: #d64545; }
      #topic-error { color: #d64545; font-size: .85rem; min-height: 1.2em; margin-bottom: .4rem; }
      ul { list-style: none; margin: 0; padding: 0; border-top: 1px solid var(--line); }
      li { padding: .4rem .2rem; border-bottom: 1px solid var(--line); font: 13px/1.4 ui-monospace, Menlo, Consolas, monospace;
           white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
      li .seq { display: inline-block; min-width: 4ch; margin-right: .75rem; text-align: right; color: var(--muted); }
    </style>
    </head>
    <body>
    <h1>Live feed</h1>
    <form id="topic-form">
      <label for="topic">topic</label>
      <input id="topic" value="feed" maxlength="64" autocomplete="off" spellcheck="false">
      <button id="topic-button" type="submit">Switch</button>
    </form>
    <div id="topic-error"></div>
    <div class="bar">
      <span>topic <span id="current-topic">feed</span></span>
      <span>status <span id="status" data-state="connecting">connecting</span></span>
      <span>online <span id="online">–</span></span>
      <span>gaps <span id="gaps">0 (0 dropped)</span></span>
    </div>
    <div id="recovery"></div>
    <form id="publish-form">
      <input id="publish-text" placeholder="Publish a message" autocomplete="off" required>
      <button id="publish-button" type="submit">Publish</button>
    </form>
    <div id="publish-result"></div>
    <ul id="messages"></ul>
    <script>
    "use strict";
    const $ = (id) => document.getElementById(id);
    const maxItems = 100;
    const topicPattern = /^[a-z0-9_-]{1,48}$/;
    let gapFrames = 0, droppedBefore = 0, dropped = 0, attempt = 0, lastSeq = null;
    // The numbering of the topic's seq (the ready frame's epoch) and the last seq this page has:
    // a reconnect asks for what came after it.
    let epoch = null, resumeSeq = null, readySeq = null;
    let topic = "feed", socket = null, retry = null;

    // The reason `name` is not a topic the server takes, or "".
    function topicProblem(name) {
      if (name === "") return "topic is empty";
      if (name.length > 48) return `topic is ${name.length} characters long: at most 48`;
      if (!topicPattern.test(name)) return "topic may only have a-z, 0-9, _ and -";
      return "";
    }

    function setStatus(state) {
      $("status").textContent = state;
      $("status").dataset.state = state;
    }

    function addMessage(seq, body) {
      const item = document.createElement("li");
      const number = document.createElement("span");
      number.className = "seq";
      number.textContent = seq;
      item.append(number, document.createTextNode(body));
      item.title = body;
      const list = $("messages");
      list.prepend(item);
      while (list.children.length > maxItems) list.lastElementChild.remove();
    }

    function connect() {
      const scheme = location.protocol === "https:" ? "wss:" : "ws:";
      const resume = epoch === null || resumeSeq === null ? "" : `&since=${resumeSeq}&epoch=${epoch}`;
      socket = new WebSocket(`${scheme}//${location.host}/feed?topic=${encodeURIComponent(topic)}${resume}`);
      setStatus("connecting");
      socket.onmessage = (event) => {
        let frame;
        try { frame = JSON.parse(event.data); } catch { return; }
        switch (frame.type) {
          case "ready":
            attempt = 0;
            if (frame.epoch !== epoch) { epoch = frame.epoch; lastSeq = null; } // another numbering
            readySeq = frame.seq;
            if (resumeSeq === null || lastSeq === null) resumeSeq = frame.seq;
            setStatus("ready");
            break;
          case "recovered": // what this page missed came just before, in order
            setStatus("recovered");
            $("recovery").textContent = frame.to >= frame.from
              ? `recovered ${frame.to - frame.from + 1} missed (seq ${frame.from}–${frame.to})` : "recovered: nothing missed";
            break;
          case "message":
            if (frame.seq === lastSeq) break; // the replay of one already shown, after a reconnect
            lastSeq = resumeSeq = frame.seq;
            if ($("status").dataset.state === "resync") setStatus("ready");
            addMessage(frame.seq, typeof frame.body === "string" ? frame.body : JSON.stringify(frame.body));
            break;
          case "gap": // `dropped` is this subscription's running total
            gapFrames += 1;
            dropped = droppedBefore + frame.dropped;
            $("gaps").textContent = `${gapFrames} (${dropped} dropped)`;
            break;
          case "online":
            $("online").textContent = frame.count;
            break;
          case "resync": // the database came back, or a reconnect could not be served: messages in between are lost
            setStatus("resync");
            $("recovery").textContent = frame.reason ? `resync: ${frame.reason}` : "resync: the feed's database came back";
            if (frame.reason) resumeSeq = readySeq; // told what was lost: go on from this connection's start
            break;
        }
      };
      socket.onclose = () => {
        setStatus("closed");
        droppedBefore = dropped;
        const delay = Math.min(10000, 500 * 2 ** attempt) * (0.75 + Math.random() / 2);
        attempt = Math.min(attempt + 1, 5);
        retry = setTimeout(connect, delay);
      };
    }

    // Leaves the current topic (its socket, its list, its counts) for `name`.
    function switchTopic(name) {
      const problem = topicProblem(name);
      $("topic").setAttribute("aria-invalid", problem ? "true" : "false");
      $("topic-error").textContent = problem;
      if (problem) return false;
      if (socket) { socket.onmessage = socket.onclose = null; socket.close(); }
      clearTimeout(retry);
      topic = name;
      $("topic").value = name;
      $("current-topic").textContent = name;
      $("messages").replaceChildren();
      gapFrames = droppedBefore = dropped = attempt = 0;
      lastSeq = epoch = resumeSeq = null;
      $("recovery").textContent = "";
      $("gaps").textContent = "0 (0 dropped)";
      $("online").textContent = "–";
      $("publish-result").textContent = "";
      const url = new URL(location.href);
      url.searchParams.set("topic", name);
      history.replaceState(null, "", url);
      connect();
      return true;
    }

    $("topic-form").addEventListener("submit", (event) => {
      event.preventDefault();
      switchTopic($("topic").value);
    });
    $("topic").addEventListener("input", () => {
      const problem = topicProblem($("topic").value);
      $("topic").setAttribute("aria-invalid", problem ? "true" : "false");
      $("topic-error").textContent = problem;
    });

    $("publish-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = $("publish-text").value;
      if (text === "") return;
      $("publish-button").disabled = true;
      try {
        const response = await fetch(`/publish?topic=${encodeURIComponent(topic)}`, { method: "POST", body: text });
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        $("publish-text").value = "";
        $("publish-result").textContent = "published";
      } catch (error) {
        $("publish-result").textContent = `not published: ${error.message}`;
      } finally {
        $("publish-button").disabled = false;
        $("publish-text").focus();
      }
    });

    const asked = new URLSearchParams(location.search).get("topic");
    if (asked === null || !switchTopic(asked)) connect();
    </script>
    </body>
    </html>
    """#
}
