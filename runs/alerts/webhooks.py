"""Where a webhook may go, and posting to it.

A webhook URL is a request the server makes on a user's behalf, so it follows the one rule for such URLs
(workers.contract.inputs.host_rule, shared with capture servers): its host must be listed in
EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS, and every address the name resolves to must be public, unless that
address (or a network holding it) is listed too. The POST then connects to the very address checked (no
second resolution that could answer otherwise) and follows no redirect."""
from __future__ import annotations

import json

from django.conf import settings

from workers.contract.inputs.host_rule import Destination, HostRefused, check_url, pinned_request

TIMEOUT_SECONDS = 10
ANSWER_BYTES = 2000

WebhookRefused = HostRefused  # the URL may not be posted to; the message says why


def webhook_check(url: str) -> Destination:
    """The URL's destination, or WebhookRefused naming what is wrong with it."""
    return check_url(url, allowed=settings.EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS, setting="EAGLE3WEB_WEBHOOK_ALLOWED_HOSTS",
                     what="webhook")


def webhook_post(url: str, text: str) -> None:
    """POST {"text": text} (what Slack's incoming webhooks read); raises WebhookRefused for a destination
    that is not allowed, OSError or WebhookFailed for one that did not take it."""
    destination = webhook_check(url)
    body = json.dumps({"text": text}).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "eagle3web-alerts"}
    status, answer, _ = pinned_request(destination, "POST", "", body=body, headers=headers, timeout=TIMEOUT_SECONDS,
                                       limit=ANSWER_BYTES)
    if not 200 <= status < 300:
        raise WebhookFailed(f"the webhook answered HTTP {status}: {answer.decode('utf-8', 'replace')[:300]}")


class WebhookFailed(RuntimeError):
    """The webhook answered, but not with a 2xx."""
