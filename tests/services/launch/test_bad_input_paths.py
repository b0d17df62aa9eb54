"""Bad-input corpus: paths users type (launch service, import service, the inspect API).
Each is refused with PathNotAllowed (a 400 on the API) naming the path, and nothing is stored."""
import pytest

from runs.pipeline import services
from runs.data.extractions import extraction_import
from runs.models import Dataset, Extraction, PipelineRun, TargetModel
from runs.data.paths import MAX_COMPONENT_BYTES, MAX_PATH_CHARS, PathNotAllowed, check_under_data_roots
from runs.pipeline.launch.run_config import RunConfig

pytestmark = pytest.mark.django_db


def counts():
    return (TargetModel.objects.count(), PipelineRun.objects.count(), Dataset.objects.count(),
            Extraction.objects.count())


@pytest.mark.parametrize(
    "suffix, problem",
    [
        ("/" + "a" * 300, f"at most {MAX_COMPONENT_BYTES} bytes per name"),
        ("/" + "é" * 200, f"at most {MAX_COMPONENT_BYTES} bytes per name"),
        ("/x" * 3000, f"the limit is {MAX_PATH_CHARS}"),
        ("/a\x00b", "contains a NUL byte"),
        ("/a\nb", "contains the control character"),
        ("/a\x1bb", "contains the control character"),
    ],
    ids=["300-char-component", "400-byte-component", "6000-char-path", "nul", "newline", "escape"],
)
def test_bad_paths_are_refused_by_the_launch_service(data_root, user, suffix, problem):
    before = counts()
    with pytest.raises(PathNotAllowed) as err:
        services.run_launch(user=user, target_path=f"{data_root}{suffix}", dataset_path=f"{data_root}/c.jsonl",
                            config=RunConfig(), enqueue=False)
    message = str(err.value)
    assert problem in message and "target directory" in message
    assert len(message) < 1000, "the message repeats a bounded part of the path"
    assert counts() == before


def test_a_symlink_loop_is_refused_with_a_message(data_root, tmp_path):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    with pytest.raises(PathNotAllowed, match="dataset file .*loop1.* cannot be resolved"):
        check_under_data_roots(str(tmp_path / "loop1" / "x.jsonl"), kind="dataset file")


def test_a_bad_import_path_is_refused_before_anything_is_stored(data_root, user):
    before = counts()
    with pytest.raises(PathNotAllowed, match="extraction directory .* bytes per name"):
        extraction_import(path=f"{data_root}/{'z' * 400}", user=user)
    assert counts() == before


@pytest.mark.parametrize(
    "path, problem",
    [
        ("{root}/" + "a" * 300, "bytes per name"),
        ("{root}" + "/x" * 3000, "characters long"),
        ("relative/path", "must be an absolute path"),
        ("", "is empty"),
        ("{root}/missing", "does not exist"),
    ],
    ids=["300-char-component", "6000-chars", "relative", "empty", "missing"],
)
def test_api_inspect_answers_400_for_bad_paths(client, user, data_root, path, problem):
    client.force_login(user)
    response = client.get("/api/v1/targets/inspect/", {"path": path.format(root=data_root)})
    assert response.status_code == 400
    assert problem in response.json()["error"] and "target directory" in response.json()["error"]


def test_api_inspect_answers_400_naming_the_field_for_a_nul_path(client, user, data_root):
    """Refused with every text no database stores, before the path is looked at (eagle3web.unstorable_input)."""
    client.force_login(user)
    response = client.get("/api/v1/targets/inspect/", {"path": f"{data_root}/a\x00b"})
    assert response.status_code == 400
    assert response.json()["error"].startswith("path holds a NUL character") and list(response.json()["fields"]) == ["path"]


def test_api_inspect_answers_400_for_a_file(client, user, data_root, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    client.force_login(user)
    response = client.get("/api/v1/targets/inspect/", {"path": str(tmp_path / "config.json")})
    assert response.status_code == 400 and "is not a directory" in response.json()["error"]


def test_import_view_shows_a_message_for_a_nul_path(client, user, data_root):
    client.force_login(user)
    response = client.post("/extractions/import/", {"path": f"{data_root}/a\x00b"})
    assert response.status_code == 400
    assert "Path holds a NUL character" in response.content.decode()  # the message, capitalised, names the field
    assert Extraction.objects.count() == 0
