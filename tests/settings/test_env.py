import pytest

from eagle3web.env import EnvError, env_bool, env_int, env_paths


def test_env_bool_reads_true_and_false_words(monkeypatch):
    monkeypatch.setenv("X_FLAG", "yes")
    assert env_bool("X_FLAG", False) is True
    monkeypatch.setenv("X_FLAG", "off")
    assert env_bool("X_FLAG", True) is False


def test_env_bool_refuses_maybe(monkeypatch):
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(EnvError, match="X_FLAG='maybe' is not a boolean"):
        env_bool("X_FLAG", False)


def test_env_int_names_bad_value(monkeypatch):
    monkeypatch.setenv("X_NUM", "ten")
    with pytest.raises(EnvError, match="X_NUM='ten' is not an integer"):
        env_int("X_NUM", 1)


def test_env_paths_refuses_relative_root(monkeypatch):
    monkeypatch.setenv("X_ROOTS", "/data:models")
    with pytest.raises(EnvError, match="'models' is not an absolute path"):
        env_paths("X_ROOTS", [])


def test_env_paths_resolves_each_root(monkeypatch, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("X_ROOTS", f"{tmp_path / 'link'}:/")
    assert env_paths("X_ROOTS", []) == [(tmp_path / "real").resolve(), __import__("pathlib").Path("/")]
