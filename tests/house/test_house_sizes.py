"""A reader opens a folder and finds at most about a dozen entries, and a file that fits in a sitting: folders
of the code (runs/, workers/, eagle3web/, templates/, static/js/, bench/) and of its tests (tests/, whose
folders mirror the code's) hold at most FOLDER_ENTRIES entries, files of the house at most FILE_LINES lines.
What is over today is listed with its size, a ceiling that may only come down: a listed folder or file may
not grow, and one back under the limit leaves its list.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FOLDER_ENTRIES = 12
FILE_LINES = 400
FOLDER_ROOTS = ("runs", "workers", "eagle3web", "templates", "static/js", "bench", "tests")
FILE_ROOTS = ("runs", "workers", "eagle3web", "templates", "static/js", "bench", "tests", "client")
SKIPPED = {"migrations", "old_migrations", "__pycache__", "vendor"}

FOLDERS_OVER = {
    "runs": 21,
    "runs/management/commands": 14,
    "runs/pipeline": 13,
    "tests": 19,
}
FILES_OVER: dict[str, int] = {}


def _entries(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.name not in SKIPPED and not p.name.startswith("."))


def _folders():
    for root in FOLDER_ROOTS:
        for folder in [ROOT / root, *(ROOT / root).rglob("*")]:
            if folder.is_dir() and not SKIPPED & set(folder.relative_to(ROOT).parts):
                yield str(folder.relative_to(ROOT)), _entries(folder)


def _files():
    for root in FILE_ROOTS:
        for path in (ROOT / root).rglob("*"):
            if path.suffix in (".py", ".html", ".js") and not SKIPPED & set(path.relative_to(ROOT).parts):
                yield str(path.relative_to(ROOT)), len(path.read_text().splitlines())


def test_folders_hold_at_most_a_dozen_entries():
    over = {name: n for name, n in _folders() if n > FOLDERS_OVER.get(name, FOLDER_ENTRIES)}
    assert over == {}, f"at most {FOLDER_ENTRIES} entries (a listed folder: no more than its ceiling)"


def test_files_stay_under_400_lines():
    over = {name: n for name, n in _files() if n > FILES_OVER.get(name, FILE_LINES)}
    assert over == {}, f"at most {FILE_LINES} lines (a listed file: no more than its ceiling)"


def test_the_lists_of_what_is_over_only_shrink():
    folders, files = dict(_folders()), dict(_files())
    stale = sorted(name for name, ceiling in FOLDERS_OVER.items() if folders.get(name, 0) <= FOLDER_ENTRIES)
    stale += sorted(name for name, ceiling in FILES_OVER.items() if files.get(name, 0) <= FILE_LINES)
    assert stale == [], "back under the limit (or gone): take them off FOLDERS_OVER / FILES_OVER"


if __name__ == "__main__":
    print({name: n for name, n in sorted(_folders()) if n > FOLDER_ENTRIES})
    print({name: n for name, n in sorted(_files()) if n > FILE_LINES})
