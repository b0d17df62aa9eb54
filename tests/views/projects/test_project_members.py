"""A project's members, managed through /api/v1/projects/<id>/members/ and the page /projects/<id>/: its
owners (and staff) add a user by username with a role, change it, remove them; nobody else may (403, or
404 where they do not see the project); bad input is refused naming the field, and nothing changes."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from runs.models import ProjectMember
from runs.projects.services import project_create, project_member_set

pytestmark = pytest.mark.django_db


def _person(name, *groups, staff=False):
    account = get_user_model().objects.create_user(name, password=f"pw-{name}-1", is_staff=staff)
    for group in groups:
        account.groups.add(Group.objects.get_or_create(name=group)[0])
    return account


@pytest.fixture
def secret(user):
    return project_create(user=user, name="secret")


def _roles(project) -> dict:
    return dict(ProjectMember.objects.filter(project=project).values_list("user__username", "role"))


def test_members_round_trip_through_the_api(client, user, secret):
    _person("olga")
    client.force_login(user)
    url = f"/api/v1/projects/{secret.pk}/members/"
    assert client.get(url).json() == {"project": secret.pk, "name": "secret", "open_to_all": False,
                                      "results": [{"username": "launcher", "role": "owner"}]}
    added = client.post(url, {"username": "olga", "role": "editor"}, content_type="application/json")
    assert added.status_code == 200
    assert added.json()["results"] == [{"username": "launcher", "role": "owner"}, {"username": "olga", "role": "editor"}]
    client.post(url, {"username": "olga", "role": "viewer"}, content_type="application/json")
    assert _roles(secret) == {"launcher": "owner", "olga": "viewer"}
    bad_role = client.post(url, {"username": "olga", "role": "boss"}, content_type="application/json")
    assert bad_role.status_code == 400 and "viewer, editor, owner" in bad_role.json()["fields"]["role"]
    nobody = client.post(url, {"username": "nobody", "role": "viewer"}, content_type="application/json")
    assert nobody.status_code == 400 and "no user 'nobody'" in nobody.json()["fields"]["username"]
    last = client.delete(f"{url}launcher/")
    assert last.status_code == 400 and "last owner" in last.json()["fields"]["username"]
    assert _roles(secret) == {"launcher": "owner", "olga": "viewer"}
    assert client.delete(f"{url}olga/").status_code == 204
    assert client.delete(f"{url}olga/").status_code == 404
    assert _roles(secret) == {"launcher": "owner"}


def test_a_non_owner_cannot_change_members(client, user, secret):
    viewer, outsider = _person("vic", "launcher", "admin"), _person("otto", "launcher", "admin")
    project_member_set(project=secret, user=user, username="vic", role="editor")
    url = f"/api/v1/projects/{secret.pk}/members/"
    client.force_login(viewer)
    assert client.get(url).status_code == 200
    refused = client.post(url, {"username": "otto", "role": "owner"}, content_type="application/json")
    assert refused.status_code == 403 and "owner" in refused.json()["error"]
    assert client.delete(f"{url}launcher/").status_code == 403
    assert client.post(f"/projects/{secret.pk}/", {"username": "otto", "role": "owner"}).status_code == 403
    assert client.post(f"/projects/{secret.pk}/", {"remove": "launcher"}).status_code == 403
    client.force_login(outsider)  # not a member: the project is not found at all
    assert client.get(url).status_code == 404
    assert client.post(url, {"username": "otto", "role": "owner"}, content_type="application/json").status_code == 404
    assert client.get(f"/projects/{secret.pk}/").status_code == 404
    assert client.post(f"/projects/{secret.pk}/", {"username": "otto", "role": "owner"}).status_code == 404
    assert _roles(secret) == {"launcher": "owner", "vic": "editor"}
    # Staff manage any project's members.
    client.force_login(_person("sam", staff=True))
    assert client.post(url, {"username": "otto", "role": "viewer"}, content_type="application/json").status_code == 200
    assert _roles(secret) == {"launcher": "owner", "otto": "viewer", "vic": "editor"}


def test_members_round_trip_through_the_page(client, user, secret):
    _person("olga")
    client.force_login(user)
    page = client.get(f"/projects/{secret.pk}/")
    html = page.content.decode()
    assert page.status_code == 200 and 'id="member-form"' in html and 'data-member="launcher"' in html
    assert "csrfmiddlewaretoken" in html
    added = client.post(f"/projects/{secret.pk}/", {"username": "olga", "role": "editor"})
    assert added.status_code == 302 and added["Location"] == f"/projects/{secret.pk}/"
    html = client.get(f"/projects/{secret.pk}/").content.decode()
    assert '<tr data-member="olga">' in html and 'data-role="editor"' in html
    refused = client.post(f"/projects/{secret.pk}/", {"username": "nobody", "role": "boss"})
    html = refused.content.decode()
    assert refused.status_code == 400
    assert 'data-field="role"' in html and "Select a valid choice" in html
    refused = client.post(f"/projects/{secret.pk}/", {"username": "nobody", "role": "viewer"})
    assert refused.status_code == 400 and "no user &#x27;nobody&#x27;" in refused.content.decode()
    assert client.post(f"/projects/{secret.pk}/", {"remove": "olga"}).status_code == 302
    assert _roles(secret) == {"launcher": "owner"}
    # A member who is not an owner reads the page without the form.
    project_member_set(project=secret, user=user, username="olga", role="viewer")
    client.force_login(get_user_model().objects.get(username="olga"))
    html = client.get(f"/projects/{secret.pk}/").content.decode()
    assert 'data-member="launcher"' in html and 'id="member-form"' not in html


def test_the_page_and_api_need_a_login(client, secret):
    assert client.get(f"/projects/{secret.pk}/")["Location"].startswith("/login/")
    assert client.get(f"/api/v1/projects/{secret.pk}/members/").status_code == 401
