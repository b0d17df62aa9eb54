"""A person makes an API token on their account page, copies it once, a script uses it, the page
shows when it was last used, and revoking it stops the script; the API page lists the endpoints."""
import http.client
import json
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.django_db(transaction=True)]


def script_get(base: str, path: str, token: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(urlsplit(base).netloc, timeout=30)
    connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_a_token_made_on_the_page_works_once_copied_and_stops_when_revoked(live_server, user, page):
    from runs.api.tokens import auth_failures_clear

    auth_failures_clear(client="127.0.0.1")
    page.goto(live_server.url + "/account/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{live_server.url}/account/")
    expect(page.locator(".empty").first).to_have_text("No token yet.")
    page.fill("input[name=name]", "slurm cluster")
    page.click("text=Make a token")
    expect(page.locator("#new-token")).to_contain_text("it is not shown again")
    token = page.locator("#token-secret").inner_text().strip()
    assert token.startswith("e3w_")
    status, me = script_get(live_server.url, "/api/v1/me/", token)
    assert (status, me["username"], me["roles"]) == (200, "launcher", ["launcher"])
    page.goto(live_server.url + "/account/")  # shown once: not on the page any more
    expect(page.locator("#new-token")).to_have_count(0)
    row = page.locator("#tokens tbody tr").first
    expect(row).to_contain_text("slurm cluster")
    expect(row).to_contain_text(token[:12])
    expect(row).not_to_contain_text("never")  # last used: just now
    expect(page.locator("#audit")).to_contain_text("GET /api/v1/me/")
    page.click("#tokens button:has-text('Revoke')")
    expect(page.locator(".message.success")).to_contain_text("Revoked slurm cluster")
    expect(page.locator("#tokens tbody tr").first).to_contain_text("revoked")
    status, refused = script_get(live_server.url, "/api/v1/me/", token)
    assert status == 401 and "was revoked" in refused["error"]
    page.click("nav a:text-is('API')")
    expect(page.locator("#api-index")).to_contain_text("/api/v1/runs/")
    page.click("#api-index a:has-text('/api/v1/runs/') >> nth=1")  # GET, then POST
    expect(page.locator("#post-api-v1-runs h2")).to_have_text("POST /api/v1/runs/")
    expect(page.locator("#post-api-v1-runs")).to_contain_text("layer_ids")
