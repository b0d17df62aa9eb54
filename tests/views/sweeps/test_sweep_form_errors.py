"""The launch form's sweep box says what is wrong in the form's words (its label, "settings", KEY = V1,
V2 lines), not the command line's (--vary), and names every bad line at once (issue 28). The command
keeps its own wording."""
import pytest

from runs.sweeps.spec import SWEEP_KEYS, SweepError, accepted_keys, normalise_key, parse_vary
from runs.web.forms import LaunchForm

pytestmark = pytest.mark.django_db


@pytest.fixture
def form(roots):
    return {"target_path": str(roots / "target"), "dataset_path": str(roots / "chats.jsonl"), "max_seq_len": 512,
            "draft_vocab_size": 64, "epochs": 1, "lr": 0.0003, "ttt_steps": 3, "sweep_mode": "grid", "parallel": 1}


def box_errors(html: str) -> list[str]:
    box = html.split('data-field="vary"')[1].split('<div class="hint">')[0]
    return [part.split("</div>")[0] for part in box.split('<div class="field-error">')[1:]]


def test_every_bad_line_is_named_at_once_in_the_forms_words(client, user, form):
    client.force_login(user)
    vary = "colour = red, blue\nepochs = 1, two\nseed = 1, 2\nttt_steps 1, 2\nlr = 1e-4, 1e-4"
    response = client.post("/runs/new/", {**form, "vary": vary})
    assert response.status_code == 400
    html = response.content.decode()
    errors = box_errors(html)
    assert errors == [
        "&#x27;colour&#x27; is not a setting; settings you can sweep (by name or label): "
        + accepted_keys().replace('"', "&quot;"),
        "epochs = two: epochs takes whole numbers",
        "&#x27;ttt_steps 1, 2&#x27; has no &#x27;=&#x27;: write one setting per line as KEY = V1, V2 "
        "(e.g. lr = 1e-4, 3e-4)",
        "lr: 1e-4 and 1e-4 are the same value; each run of a sweep differs",
    ]
    assert not any("--vary" in e or "option" in e for e in errors)
    summary = html.split('id="launch-errors"')[1].split("</div>")[0]
    assert "4 problems to fix" in summary
    assert ('<a href="#id_vary">Sweep</a>: &#x27;colour&#x27; is not a setting; settings you can sweep (by name or '
            "label): layer_ids, ") in summary
    assert summary.count('<a href="#id_vary">Sweep</a>:') == 4


def test_a_key_given_twice_is_named_in_the_forms_words(form):
    bound = LaunchForm(data={**form, "vary": "epochs = 1, 2\nseed = 1, 2\nEpochs = 3"})
    assert not bound.is_valid()
    assert bound.errors["vary"] == ["epochs is on 2 lines; put all its values on one line"]


def test_a_default_where_there_is_none_says_setting(form):
    bound = LaunchForm(data={**form, "vary": "epochs = default, 2"})
    assert not bound.is_valid()
    assert bound.errors["vary"] == ["epochs = default: only layer_ids, max_samples, max_tokens_per_step have a "
                                    "default to sweep over"]


def test_the_command_keeps_its_wording():
    with pytest.raises(SweepError) as caught:
        parse_vary("colour=red")
    assert str(caught.value).startswith("--vary 'colour': not an option a sweep can vary; vary one of ")
    with pytest.raises(SweepError) as caught:
        parse_vary("epochs=1,two")
    assert str(caught.value) == "--vary epochs=two: epochs takes whole numbers"


def test_a_good_box_still_launches_a_sweep(client, user, form):
    from runs.models import Sweep

    client.force_login(user)
    response = client.post("/runs/new/", {**form, "vary": "epochs = 1, 2\n\nseed = 3, 4"})
    assert response.status_code == 302 and response["Location"] == f"/sweeps/{Sweep.objects.get().pk}/"


@pytest.mark.parametrize("vary, mode, expected", [
    # Found only once the sweep is expanded at launch (runs.sweeps.spec.expand), after the box parsed.
    ("epochs = 1, 2, 3\nseed = 1, 2", "list",
     "Combine &quot;List&quot; takes the i-th value of every line together, so each line needs as many values: "
     "epochs has 3, seed has 2"),
    ("seed = " + ", ".join(str(i) for i in range(9)) + "\nepochs = " + ", ".join(str(i) for i in range(1, 9)), "grid",
     "this sweep would launch 72 runs; at most 64 at once (give fewer values, or Combine &quot;List&quot; to take "
     "the i-th values of every line together)"),
    # Found by a run's own launch (runs.pipeline.services.run_launch), for the swept value to blame.
    ("max_seq_len = 512, 99999999", "grid", "max_seq_len = 99999999: "),
])
def test_errors_found_at_launch_speak_the_forms_words_and_store_nothing(client, user, form, vary, mode, expected):
    from runs.models import PipelineRun, Sweep

    client.force_login(user)
    response = client.post("/runs/new/", {**form, "vary": vary, "sweep_mode": mode})
    assert response.status_code == 400
    errors = box_errors(response.content.decode())
    assert len(errors) == 1 and errors[0].startswith(expected), errors
    assert "--vary" not in errors[0] and "--list" not in errors[0]
    assert (Sweep.objects.count(), PipelineRun.objects.count()) == (0, 0)


def test_the_forms_field_names_and_labels_name_the_sweep_keys(form):
    """Each sweepable field of the launch form, by its name or its label as the form shows it (any case,
    spaces or hyphens), names its key; and the error lists each key with its label."""
    fields = LaunchForm().fields
    for key in SWEEP_KEYS:
        name = "dataset_path" if key == "dataset" else key
        label = str(fields[name].label or name.replace("_", " ").capitalize())
        assert (normalise_key(name), normalise_key(label), normalise_key(label.upper())) == (key, key, key), label
    assert 'lr ("Learning rate")' in accepted_keys()


def test_a_box_written_with_the_forms_label_launches_a_sweep_of_its_key(client, user, form):
    from runs.models import Sweep

    client.force_login(user)
    response = client.post("/runs/new/", {**form, "vary": "Learning rate = 1e-4, 3e-4"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Sweep.objects.get().varied == [["lr", ["1e-4", "3e-4"]]]
