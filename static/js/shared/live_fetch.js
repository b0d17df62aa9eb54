// Polls that find nothing new cost the server one small query (runs.live): each poll sends back the
// ETag of the last answer it had from the same URL (If-None-Match), and a 304 means "what you have is
// current". The ETag is sent explicitly, with the browser's HTTP cache out of the way, so that every
// poll is conditional and the page hears of the 304 instead of getting the old answer replayed.
(function () {
  "use strict";
  const last = {};  // channel -> {url, etag}: one entry per poll loop, not one per URL ever asked

  // The JSON at `url`, or null when it has not changed since this channel's last answer from that URL;
  // no channel: always the answer (a one-off read, such as a zoomed window). anyUrl: the ETag goes with
  // the channel's next poll even when its URL moved (the curves' poll, whose ETag names the curves' state).
  window.liveJson = async function (channel, url, {anyUrl = false} = {}) {
    const known = channel && last[channel];
    const headers = {Accept: "application/json"};
    if (known && (anyUrl || known.url === url) && known.etag) headers["If-None-Match"] = known.etag;
    const resp = await fetch(url, {headers, cache: "no-store"});
    if (resp.status === 304) return null;
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || resp.status);
    if (channel) last[channel] = {url, etag: resp.headers.get("ETag")};
    return body;
  };
})();
