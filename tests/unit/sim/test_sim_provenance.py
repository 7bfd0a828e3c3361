"""A simulated result names the code it came from (sim/provenance.py): the commit of the tree `sim` was imported from
and the files changed in it, in `janus sim`'s summary.json, and `--compare` says when two runs ran other code."""
import shutil
import subprocess
from pathlib import Path

import pytest

import sim
from sim.provenance import code_provenance, describe, is_same_code

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _repo(path: Path) -> Path:
    path.mkdir()
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "sim@example.invalid")
    _git(path, "config", "user.name", "sim")
    for name in ("a.py", "b.py"):
        (path / name).write_text("x = 1\n")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "first")
    return path


@needs_git
def test_a_clean_checkout_is_named_by_its_commit(tmp_path):
    repo = _repo(tmp_path / "repo")
    code = code_provenance(repo)
    assert code["commit"] == _git(repo, "rev-parse", "HEAD").strip()
    assert code["changed_files"] == [] and code["source_dir"] == str(repo.resolve())
    assert describe(code).startswith(f"{code['commit'][:12]} (no changes)")


@needs_git
def test_an_edit_in_progress_is_named_and_is_not_the_same_code(tmp_path):
    repo = _repo(tmp_path / "repo")
    clean = code_provenance(repo)
    (repo / "b.py").write_text("x = 2\n")
    edited = code_provenance(repo)
    assert edited["commit"] == clean["commit"] and edited["changed_files"] == ["b.py"]
    assert "1 file changed: b.py" in describe(edited)
    (repo / "new.py").write_text("y = 1\n")  # a module not yet added runs all the same
    (repo / "notes.txt").write_text("not code\n")
    assert code_provenance(repo)["changed_files"] == ["b.py", "new.py"]
    assert is_same_code(clean, clean) and not is_same_code(clean, edited) and not is_same_code(edited, edited)


@needs_git
def test_a_copy_inside_another_repository_does_not_borrow_its_commit(tmp_path):
    repo = _repo(tmp_path / "repo")
    copy = repo / "copy"  # a copied tree (say, tar'd out of the checkout) that happens to sit in another repository
    copy.mkdir()
    code = code_provenance(copy)
    assert code["commit"] is None and code["changed_files"] == []
    assert describe(code).startswith("not a git checkout")
    assert not is_same_code(code, code)  # two runs outside a checkout cannot be told apart


def test_the_default_is_the_tree_the_sim_package_came_from():
    assert code_provenance()["source_dir"] == str(Path(sim.__file__).resolve().parent.parent)
