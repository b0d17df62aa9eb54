import pytest
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.django_db

PAGES = ["/", "/runs/new/", "/runs/1/", "/datasets/", "/extractions/", "/extractions/1/", "/datasets/1/"]
# What the pages poll is the scripts' API: anonymous, a 401 in JSON (a script gets no login page).
APIS = ["/api/v1/runs/1/status/", "/api/v1/runs/1/metrics/", "/api/v1/targets/inspect/?path=/",
        "/api/v1/sweeps/1/", "/api/v1/workers/"]


@pytest.mark.parametrize("url", PAGES)
def test_every_page_redirects_anonymous_users_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.parametrize("url", APIS)
def test_every_api_the_pages_poll_refuses_anonymous_users(client, url):
    response = client.get(url)
    assert response.status_code == 401 and response.json()["error"].startswith("authentication required")


@pytest.mark.parametrize("url", ["/api/runs/1/", "/api/runs/1/metrics/", "/api/targets/inspect/?path=/",
                                 "/api/workers/", "/api/sweeps/1/"])
def test_the_cookie_only_api_is_gone(client, url):
    get_user_model().objects.create_user("viewer", password="pw-viewer-1")
    client.login(username="viewer", password="pw-viewer-1")
    assert client.get(url).status_code == 404


def test_admin_refuses_a_logged_in_non_staff_user(client):
    get_user_model().objects.create_user("viewer", password="pw-viewer-1")
    client.login(username="viewer", password="pw-viewer-1")
    response = client.get("/admin/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_logged_in_user_sees_the_runs_list(client):
    get_user_model().objects.create_user("viewer", password="pw-viewer-1")
    client.login(username="viewer", password="pw-viewer-1")
    response = client.get("/")
    assert response.status_code == 200
    assert b"No runs yet" in response.content


def test_launch_form_names_a_path_outside_the_roots(client, tmp_path, settings, user):
    settings.EAGLE3WEB_DATA_ROOTS = [(tmp_path / "data").resolve()]
    client.login(username="launcher", password="pw-launcher-1")
    response = client.post("/runs/new/", {
        "target_path": "/etc", "dataset_path": "/etc/passwd", "layer_ids": "", "max_seq_len": 512,
        "draft_vocab_size": 1024, "epochs": 1, "lr": 0.0003, "ttt_steps": 3,
    })
    assert response.status_code == 400
    assert b"target directory /etc is outside the allowed data roots" in response.content


def test_launch_form_names_a_bad_layer_id_list(client, user):
    client.login(username="launcher", password="pw-launcher-1")
    response = client.post("/runs/new/", {
        "target_path": "/x", "dataset_path": "/y", "layer_ids": "2, four", "max_seq_len": 512,
        "draft_vocab_size": 1024, "epochs": 1, "lr": 0.0003, "ttt_steps": 3,
    })
    assert b"layer ids must be integers separated by commas" in response.content


def test_a_viewer_posting_the_launch_form_is_refused(client, tmp_path):
    get_user_model().objects.create_user("viewer", password="pw-viewer-1")
    client.login(username="viewer", password="pw-viewer-1")
    response = client.post("/runs/new/", {
        "target_path": "/x", "dataset_path": "/y", "layer_ids": "", "max_seq_len": 512,
        "draft_vocab_size": 1024, "epochs": 1, "lr": 0.0003, "ttt_steps": 3,
    })
    assert response.status_code == 403
