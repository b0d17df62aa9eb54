"""A person filters the runs list, saves it as a view, clears the filters, and gets the view back from
the saved views menu: the same runs, the same columns, the same sort (issue 28)."""
import pytest
from playwright.sync_api import expect

from runs.models import PipelineRun, SavedView
from tests.views.runs_in_bulk import runs_made

pytestmark = pytest.mark.django_db(transaction=True)


def test_saving_and_applying_a_view(live_server, user, roots, page):
    runs = runs_made(5, roots=roots, user=user, names=["a1", "b2", "c3", "d4", "e5"])
    PipelineRun.objects.filter(pk__in=[runs[1].pk, runs[3].pk, runs[4].pk]).update(config={**runs[0].config, "epochs": 7})
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", user.raw_password)
    page.click("button[type=submit]")
    expect(page.locator("#run-table tbody tr")).to_have_count(5)

    page.click("#more-filters > summary")
    page.fill('input[name="settings"]', "epochs=7")
    page.uncheck('input[name="columns"][value="owner"]')
    page.uncheck('input[name="columns"][value="dataset"]')
    page.click("#run-filters button[type=submit]")
    page.click('a[data-sort="name"]')  # by name, A to Z
    rows = page.locator("#run-table tbody tr td:nth-child(2) a")
    expect(rows).to_have_text(["b2", "d4", "e5"])
    expect(page.locator('#run-table th[data-column="owner"]')).to_have_count(0)

    page.click("#save-view > summary")
    page.fill('#save-view-form input[name="name"]', "seven epochs")
    page.click("#save-view-form button[type=submit]")
    expect(page.locator("h1")).to_have_text("Runs · seven epochs")
    view = SavedView.objects.get()
    assert view.params["settings"] == "epochs=7" and view.params["sort"] == "name"

    page.click("text=clear")
    expect(page.locator("#run-table tbody tr")).to_have_count(5)
    expect(page.locator('#run-table th[data-column="owner"]')).to_have_count(1)
    page.select_option("#view-select", str(view.pk))
    page.click("#view-apply")
    expect(rows).to_have_text(["b2", "d4", "e5"])
    expect(page.locator('#run-table th[data-column="owner"]')).to_have_count(0)
    expect(page.locator('#run-table th[data-column="dataset"]')).to_have_count(0)
    assert page.url.endswith(f"/?view={view.pk}")

    # Ticked runs archived from the bulk bar leave the view; "Archived: shown too" brings them back.
    page.check(f'#run-table input[name="ids"][value="{runs[1].pk}"]')
    page.click('#bulk-form button[value="archive"]')
    expect(page.locator(".message")).to_contain_text("Archived 1 run(s).")
    expect(rows).to_have_text(["d4", "e5"])
