"""The snapshot's weights file by the rule pipeline/hub.py's docstring states, and the origin record a
checkpoint by name gives, on a fake cache (tests/hub_cache.py): model.safetensors, else the one
*.safetensors, else TransformerLens's *final.pth, else the one .pth or .pt; several of a kind are
refused naming the repository and the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_cache import TINY_REPO, add_snapshot
from huggingface_hub import constants

from pipeline import hub, io
from pipeline.errors import UserError
from pipeline.model import origin

KEY, VALUE = "train.checkpoint", f"hf:{TINY_REPO}"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def chosen_file(cache: Path, names: list[str]) -> str:
    """The name hub.weights picks among snapshot files `names` (their bytes do not matter here)."""
    add_snapshot(cache, TINY_REPO, {name: name.encode() for name in names})
    return hub.weights(hub.snapshot(VALUE, KEY), KEY, VALUE).name


@pytest.mark.parametrize(
    "names,picked",
    [
        (["a.safetensors", "model.safetensors", "model_final.pth"], "model.safetensors"),
        (["a.safetensors", "model_final.pth", "b.pth"], "a.safetensors"),
        (["model_final.pth", "b.pth", "c.pt"], "model_final.pth"),  # final.pth before the other .pth
        (["x.pth"], "x.pth"),
        (["x.pt", "notes.txt"], "x.pt"),
    ],
)
def test_the_weights_file_is_picked_by_the_documented_order(cache, names, picked):
    assert chosen_file(cache, names) == picked


@pytest.mark.parametrize(
    "names,what",
    [
        (["a.safetensors", "b.safetensors"], "safetensors files (a.safetensors, b.safetensors)"),
        (["a_final.pth", "b_final.pth", "c.pth"], "*final.pth files (a_final.pth, b_final.pth)"),
        (["a.pth", "b.pt"], ".pth files (a.pth, b.pt)"),
    ],
)
def test_several_weights_of_a_kind_are_refused_naming_the_repository_and_files(cache, names, what):
    with pytest.raises(UserError) as caught:
        chosen_file(cache, names)
    assert str(caught.value) == (
        f"{KEY} = {VALUE!r}: {TINY_REPO} has several {what}: name one in a copy under train.checkpoint_dir"
    )


def test_a_checkpoint_by_name_is_a_load_origin_the_train_stage_reads(cache, tmp_path):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}", "model_final.pth": b"weights"})
    chosen = hub.checkpoint(VALUE)
    assert chosen["source"] == "load"
    assert chosen["checkpoint"] == {
        "path": "model_final.pth",
        "sha256": io.sha256_file(snap / "model_final.pth"),
    }
    assert chosen["config"] == {"path": "config.json", "sha256": io.sha256_file(snap / "config.json")}
    (tmp_path / "origin.json").write_text(json.dumps(chosen))
    assert origin.read(tmp_path / "origin.json") == chosen  # origin.json as the origin stage writes it


def test_a_snapshot_the_cache_lists_as_incomplete_is_not_in_the_cache(cache):
    """The cache's tree listing of the commit (trees/<commit>.json, huggingface_hub's record of what
    the snapshot holds) names model.safetensors, which the snapshot lacks (an interrupted download):
    the library refuses it, and so does snapshot, in one line with the download command."""
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    trees = snap.parent.parent / "trees"
    trees.mkdir()
    listing = {
        "format_version": 1,
        "files": {
            "config.json": {"size": 2, "blob_id": "0" * 40},
            "model.safetensors": {"size": 8, "blob_id": "1" * 40},
        },
    }
    (trees / f"{snap.name}.json").write_text(json.dumps(listing))
    with pytest.raises(UserError) as caught:
        hub.snapshot(VALUE, KEY)
    assert str(caught.value) == (
        f"{KEY} = {VALUE!r}: revision main of {TINY_REPO} is not in the cache {cache}: "
        f"run `hf download {TINY_REPO}` first (nothing is downloaded at run time)"
    )
    (snap / "model.safetensors").write_bytes(b"weights!")  # the download completed
    assert hub.snapshot(VALUE, KEY).path == snap


def test_a_snapshot_without_weights_is_refused_naming_its_commits_first_12_characters(cache):
    commit = "0123456789abcdef0123456789abcdef01234567"
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"}, commit=commit)
    with pytest.raises(UserError) as caught:
        hub.weights(hub.snapshot(VALUE, KEY), KEY, VALUE)
    assert str(caught.value) == (
        f"{KEY} = {VALUE!r}: the cached snapshot 0123456789ab of {TINY_REPO} has no weights "
        f"(.safetensors, *final.pth, .pth): run `hf download {TINY_REPO}`"
    )


def test_a_ref_the_system_cannot_read_is_a_damaged_cache_named_with_the_systems_reason(cache, monkeypatch):
    """An OSError's own wording (its strerror) is the reason; the test runs as root, where no file
    mode makes a file unreadable, so reading the ref is made to fail as an unreadable file does."""
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}", "model.safetensors": b"w"})
    ref = snap.parent.parent / "refs" / "main"
    read_text = Path.read_text

    def refusing(self, *args, **kwargs):
        if self == ref:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refusing)
    with pytest.raises(UserError) as caught:
        hub.snapshot(VALUE, KEY)
    assert str(caught.value) == (
        f"{KEY} = {VALUE!r}: the Hugging Face cache is damaged: {ref} is unreadable (Permission denied) "
        f"(an interrupted or disk-full download): run `hf download {TINY_REPO}` to write it again"
    )


# The whole one-line refusal of each of hub.py's raises, on the smallest fake cache that reaches it.
ADVICE = f"run `hf download {TINY_REPO}` first (nothing is downloaded at run time)"


def refusal(value: str = VALUE, call=None) -> str:
    with pytest.raises(UserError) as caught:
        (call or (lambda: hub.snapshot(value, KEY)))()
    return str(caught.value)


def test_the_download_command_names_the_file_and_the_revision():
    assert hub.Spec("org/a", None).download() == "hf download org/a"
    assert hub.Spec("org/a", "v1").download("config.json") == "hf download org/a config.json --revision v1"


def test_a_repository_absent_from_the_cache_is_refused_naming_the_cache_and_the_command(cache):
    assert refusal() == (f"{KEY} = {VALUE!r}: {TINY_REPO} is not in the Hugging Face cache {cache}: {ADVICE}")


def test_an_empty_folder_of_refs_is_refused_without_naming_refs_inside(cache):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    (snap.parent.parent / "refs" / "v1").mkdir()
    value = f"hf:{TINY_REPO}@v1"
    assert refusal(value) == (
        f"{KEY} = {value!r}: revision v1 names a folder (refs/v1), not a branch, tag or commit"
    )


def test_a_folder_of_refs_names_at_most_four_refs_inside(cache):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    prs = snap.parent.parent / "refs" / "refs" / "pr"
    prs.mkdir(parents=True)
    for n in range(1, 6):
        (prs / str(n)).write_text(snap.name)
    value = f"hf:{TINY_REPO}@refs/pr"
    assert refusal(value) == (
        f"{KEY} = {value!r}: revision refs/pr names a folder (refs/refs/pr), not a branch, tag or commit: "
        "name one of refs/pr/1, refs/pr/2, refs/pr/3, refs/pr/4"
    )


def test_a_revision_without_a_ref_is_refused_naming_the_cache_and_the_command(cache):
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    value = f"hf:{TINY_REPO}@v9"
    assert refusal(value) == (
        f"{KEY} = {value!r}: revision v9 of {TINY_REPO} is not in the cache {cache}: "
        f"run `hf download {TINY_REPO} --revision v9` first (nothing is downloaded at run time)"
    )


@pytest.mark.parametrize(
    "content,reason",
    [(b"", "empty"), (b"0123456789abcdefghijklmnop", "not a commit hash ('0123456789abcdefghij')")],
)
def test_a_garbled_ref_is_refused_whole_with_its_first_20_characters(cache, content, reason):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    ref = snap.parent.parent / "refs" / "main"
    ref.write_bytes(content)
    assert refusal() == (
        f"{KEY} = {VALUE!r}: the Hugging Face cache is damaged: {ref} is {reason} (an interrupted or "
        f"disk-full download): run `hf download {TINY_REPO}` to write it again"
    )


def test_a_ref_to_a_commit_without_a_snapshot_names_the_commits_first_12_characters(cache):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    (snap.parent.parent / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    assert refusal() == (
        f"{KEY} = {VALUE!r}: revision main (commit 0123456789ab) of {TINY_REPO} is not in the cache "
        f"{cache}: {ADVICE}"
    )


def test_a_commit_without_a_snapshot_is_named_by_its_first_12_characters(cache):
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    commit = "abcdef0123456789abcdef0123456789abcdef01"
    value = f"hf:{TINY_REPO}@{commit}"
    assert refusal(value) == (
        f"{KEY} = {value!r}: commit abcdef012345 of {TINY_REPO} is not in the cache {cache}: "
        f"run `hf download {TINY_REPO} --revision {commit}` first (nothing is downloaded at run time)"
    )


def test_several_weights_name_at_most_four_files(cache):
    names = [f"{c}.safetensors" for c in "abcde"]
    assert refusal(call=lambda: chosen_file(cache, names)) == (
        f"{KEY} = {VALUE!r}: {TINY_REPO} has several safetensors files (a.safetensors, b.safetensors, "
        "c.safetensors, d.safetensors): name one in a copy under train.checkpoint_dir"
    )


def test_a_snapshot_without_config_json_is_refused_naming_the_known_repositories(cache):
    commit = "0123456789abcdef0123456789abcdef01234567"
    add_snapshot(cache, TINY_REPO, {"model.pth": b"x"}, commit=commit)
    assert refusal(call=lambda: hub.checkpoint(VALUE)) == (
        f"{KEY} = {VALUE!r}: the cached snapshot 0123456789ab of {TINY_REPO} has no config.json "
        f"(run `hf download {TINY_REPO} config.json`; repositories known without one: "
        "callummcdougall/attn_only_2L_half)"
    )


def test_a_snapshot_without_tokenizer_json_is_refused_naming_the_download(cache):
    commit = "0123456789abcdef0123456789abcdef01234567"
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"}, commit=commit, ref="v1")
    value = f"hf:{TINY_REPO}@v1"
    assert refusal(call=lambda: hub.tokenizer_file(value)) == (
        f"data.tokenizer.pretrained = {value!r}: the cached snapshot 0123456789ab of {TINY_REPO} has no "
        f"tokenizer.json: run `hf download {TINY_REPO} tokenizer.json --revision v1`"
    )
