import pytest

from runs.data.paths import PathNotAllowed, check_under_data_roots


@pytest.fixture
def root(tmp_path, settings):
    data = tmp_path / "data"
    data.mkdir()
    settings.EAGLE3WEB_DATA_ROOTS = [data.resolve()]
    return data


def test_path_under_root_is_accepted(root):
    (root / "chats.jsonl").write_text("{}\n")
    assert check_under_data_roots(str(root / "chats.jsonl")) == (root / "chats.jsonl").resolve()


def test_path_outside_roots_is_refused_with_the_roots_named(root, tmp_path):
    (tmp_path / "elsewhere.jsonl").write_text("{}\n")
    with pytest.raises(PathNotAllowed, match=r"outside the allowed data roots.*allowed: .*data"):
        check_under_data_roots(str(tmp_path / "elsewhere.jsonl"), kind="dataset file")


def test_symlink_out_of_roots_is_refused(root, tmp_path):
    (tmp_path / "secret").mkdir()
    (root / "escape").symlink_to(tmp_path / "secret")
    with pytest.raises(PathNotAllowed, match="through a symlink") as refused:
        check_under_data_roots(str(root / "escape"))
    assert "secret" not in str(refused.value)  # where it leads outside the roots is not told


def test_dotdot_out_of_roots_is_refused(root):
    with pytest.raises(PathNotAllowed, match="outside the allowed data roots"):
        check_under_data_roots(str(root / ".." / ".."))


def test_relative_path_is_refused(root):
    with pytest.raises(PathNotAllowed, match="must be an absolute path"):
        check_under_data_roots("data/chats.jsonl")


def test_missing_path_is_named(root):
    with pytest.raises(PathNotAllowed, match="does not exist"):
        check_under_data_roots(str(root / "nope.jsonl"))
