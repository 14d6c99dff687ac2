/// The live page that `GET /` serves: plain HTML, CSS and JavaScript, no external resources.
///
/// It subscribes to `/feed` on the same host (reconnecting with backoff), shows the
/// connection's status, the `online` count, the `gap` frames and the last 100 messages
/// (newest first), and publishes what is typed with `POST /publish`.
/// `Examples/clients/browser_check.py` drives it in headless Chromium by these ids:
/// `status`, `online`, `gaps`, `messages`, `publish-text`, `publish-button`.
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
      form { display: flex; gap: .5rem; margin-bottom: .4rem; }
      input { flex: 1; padding: .5rem .7rem; border: 1px solid var(--line); border-radius: 8px; font: inherit; }
      button { padding: .5rem 1.1rem; border: 0; border-radius: 8px; background: var(--accent); color: #fff; font: inherit; cursor: pointer; }
      button:disabled { opacity: .6; cursor: default; }
      #publish-result { color: var(--muted); font-size: .85rem; min-height: 1.2em; margin-bottom: 1rem; }
      ul { list-style: none; margin: 0; padding: 0; border-top: 1px solid var(--line); }
      li { padding: .4rem .2rem; border-bottom: 1px solid var(--line); font: 13px/1.4 ui-monospace, Menlo, Consolas, monospace;
           white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
      li .seq { display: inline-block; min-width: 4ch; margin-right: .75rem; text-align: right; color: var(--muted); }
    </style>
    </head>
    <body>
    <h1>Live feed</h1>
    <div class="bar">
      <span>status <span id="status" data-state="connecting">connecting</span></span>
      <span>online <span id="online">–</span></span>
      <span>gaps <span id="gaps">0 (0 dropped)</span></span>
    </div>
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
    let gapFrames = 0, droppedBefore = 0, dropped = 0, attempt = 0, lastSeq = null;

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
      const socket = new WebSocket(`${scheme}//${location.host}/feed`);
      setStatus("connecting");
      socket.onmessage = (event) => {
        let frame;
        try { frame = JSON.parse(event.data); } catch { return; }
        switch (frame.type) {
          case "ready":
            attempt = 0;
            setStatus("ready");
            break;
          case "message":
            if (frame.seq === lastSeq) break; // the replay of one already shown, after a reconnect
            lastSeq = frame.seq;
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
          case "resync": // the database came back: messages in between are lost
            setStatus("resync");
            break;
        }
      };
      socket.onclose = () => {
        setStatus("closed");
        droppedBefore = dropped;
        const delay = Math.min(10000, 500 * 2 ** attempt) * (0.75 + Math.random() / 2);
        attempt = Math.min(attempt + 1, 5);
        setTimeout(connect, delay);
      };
    }

    $("publish-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = $("publish-text").value;
      if (text === "") return;
      $("publish-button").disabled = true;
      try {
        const response = await fetch("/publish", { method: "POST", body: text });
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

    connect();
    </script>
    </body>
    </html>
    """#
}
