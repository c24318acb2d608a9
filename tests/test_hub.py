"""Public checkpoints and tokenizers by name from the local Hugging Face cache (pipeline/hub.py),
through the real `huggingface_hub` code path, offline, on a fake cache in the library's own layout
(tests/hub_cache.py) with tiny models in NeelNanda's and ARENA's formats: the snapshot's weights
file by the rule hub.py's docstring states, the origin record a name gives, and one-line refusals
naming the key, the value and the command that repairs the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_cache import (
    ARENA_REPO,
    TINY_REPO,
    add_snapshot,
    neel_config,
    pth,
    socket_guard,
    tl_state,
    tokenizer_json,
    word_level_tokenizer,
)
from huggingface_hub import constants
from refusals import refused

from pipeline import hub, io
from pipeline.config import ModelConfig, TrainConfig, notes
from pipeline.data import corpus
from pipeline.errors import UserError
from pipeline.model import origin, tl_checkpoint
from pipeline.model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"d_head": 4, "d_model": 16}
NEEL = ModelConfig(n_heads=2, n_ctx=32, d_vocab=320, positional_embedding_type="standard",
                   normalization_type="LN", **SIZES)  # fmt: skip
ARENA = ModelConfig(n_heads=3, n_ctx=24, d_vocab=50, positional_embedding_type="shortformer",
                    normalization_type=None, **SIZES)  # fmt: skip


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache that huggingface_hub reads in this process (as HF_HUB_CACHE would set it)."""
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def logits(state: dict, cfg: ModelConfig) -> torch.Tensor:
    model = Transformer(cfg)
    model.load_state_dict({k: v for k, v in state.items() if not k.endswith(("mask", "IGNORE"))})
    tokens = torch.arange(cfg.n_ctx).remainder(cfg.d_vocab)[None]
    with torch.no_grad():
        return model(tokens)


def loaded_logits(chosen: dict) -> tuple[torch.Tensor, ModelConfig]:
    path, config = origin.checked(chosen)
    model = tl_checkpoint.load_model(path, config)
    tokens = torch.arange(model.cfg.n_ctx).remainder(model.cfg.d_vocab)[None]
    with torch.no_grad():
        return model(tokens), model.cfg


def test_neel_format_loads_by_name_with_the_same_logits(cache):
    state = tl_state(NEEL, seed=1)
    snap = add_snapshot(cache, TINY_REPO, {"config.json": json.dumps(neel_config(NEEL)).encode(),
                                           "model_final.pth": pth(state)})  # fmt: skip
    chosen = hub.checkpoint(f"hf:{TINY_REPO}")
    assert chosen["hub"] == {"repo": TINY_REPO, "revision": "main", "commit": snap.name}
    assert chosen["checkpoint"]["path"] == "model_final.pth"  # in the snapshot, not in this cache
    assert chosen["config"]["path"] == "config.json"
    got, cfg = loaded_logits(chosen)
    assert (cfg.normalization_type, cfg.positional_embedding_type, cfg.d_vocab) == ("LN", "standard", 320)
    assert torch.allclose(got, logits(state, NEEL), atol=1e-6)


def test_arena_format_without_config_takes_its_shapes_from_the_weights(cache):
    """attn_only_2L_half ships the .pth alone: its sizes come from the weights, shortformer and
    no LayerNorm from hub.KNOWN (ARENA's published HookedTransformerConfig)."""
    state = tl_state(ARENA, seed=2)
    add_snapshot(cache, ARENA_REPO, {"attn_only_2L_half.pth": pth(state)})
    chosen = hub.checkpoint(f"hf:{ARENA_REPO}")
    assert chosen["config"] == {"known": ARENA_REPO, "fields": hub.KNOWN[ARENA_REPO]}
    got, cfg = loaded_logits(chosen)
    assert (cfg.n_heads, cfg.d_head, cfg.d_model, cfg.n_ctx, cfg.d_vocab) == (3, 4, 16, 24, 50)
    assert (cfg.normalization_type, cfg.positional_embedding_type) == (None, "shortformer")
    assert torch.allclose(got, logits(state, ARENA), atol=1e-6)


def test_a_pinned_revision_reads_that_snapshot(cache):
    old, new = tl_state(NEEL, seed=3), tl_state(NEEL, seed=4)
    config = json.dumps(neel_config(NEEL)).encode()
    first = add_snapshot(cache, TINY_REPO, {"config.json": config, "model_final.pth": pth(old)}, ref="v1")
    add_snapshot(cache, TINY_REPO, {"config.json": config, "model_final.pth": pth(new)})
    pinned = hub.checkpoint(f"hf:{TINY_REPO}@v1")
    main = hub.checkpoint(f"hf:{TINY_REPO}")
    assert pinned["hub"]["commit"] == first.name != main["hub"]["commit"]
    assert pinned["checkpoint"]["sha256"] != main["checkpoint"]["sha256"]
    assert hub.checkpoint(f"hf:{TINY_REPO}@{first.name}")["checkpoint"] == pinned["checkpoint"]


R = TINY_REPO
MISSING = [  # the value, the snapshot's files (None: no repository), what else the one line names
    (f"hf:{R}", None, ("{cache}", f"`hf download {R}`")),
    (f"hf:{R}@v9", {"config.json": b"{}"}, ("{cache}", f"`hf download {R} --revision v9`")),
    (f"hf:{R}", {"config.json": b"{}"}, (f"`hf download {R}`", ".safetensors", "*final.pth")),
    (f"hf:{R}", {"model.pth": b"x"}, (f"`hf download {R} config.json`",)),
    (f"hf:{R}", {"a.pth": b"x", "b.pth": b"y", "config.json": b"{}"}, ("a.pth", "b.pth")),
]


@pytest.mark.parametrize("value,files,names", MISSING)
def test_what_is_missing_is_one_line_naming_the_download_command(cache, value, files, names):
    if files:
        add_snapshot(cache, TINY_REPO, files)
    with pytest.raises(UserError) as e:
        hub.checkpoint(value)
    text = refused(e, "train.checkpoint", value)
    assert all(name.format(cache=cache) in text for name in names), text


@pytest.mark.parametrize("value", ["hf:no-slash", "hf:org/name@", "hf:/name", "hf:org/na me"])
def test_a_malformed_name_is_refused_by_the_config(value):
    with pytest.raises(UserError) as caught:
        TrainConfig(source="load", checkpoint=value).validate()
    refused(caught, "checkpoint", value)


def neel_files(seed: int) -> dict[str, bytes]:
    return {
        "config.json": json.dumps(neel_config(NEEL)).encode(),
        "model_final.pth": pth(tl_state(NEEL, seed)),
    }


def refs_of(cache: Path, repo: str = TINY_REPO) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "refs"


@pytest.mark.parametrize("revision", ["..", ".", "main/..", "refs//pr"])
def test_a_revision_that_would_walk_the_cache_is_refused_by_the_config(revision):
    """Before huggingface_hub sees it: `@..` opened refs/.. and ended in IsADirectoryError."""
    value = f"hf:{R}@{revision}"
    with pytest.raises(UserError) as caught:
        TrainConfig(source="load", checkpoint=value).validate()
    assert repr(revision) in refused(caught, "checkpoint", value)
    with pytest.raises(UserError) as caught:
        hub.checkpoint(value)
    assert repr(revision) in refused(caught, "train.checkpoint", value)


def test_a_revision_that_names_a_folder_of_refs_is_refused_naming_the_refs_inside(cache):
    """A pull request's ref is cached as refs/refs/pr/1: `@refs/pr/1` reads its snapshot, `@refs/pr`
    (a folder) is one line naming the refs it holds, never an IsADirectoryError."""
    main = add_snapshot(cache, R, neel_files(7))
    pr = add_snapshot(cache, R, neel_files(8), ref="refs/pr/1")
    assert (refs_of(cache) / "refs" / "pr" / "1").read_text() == pr.name
    assert hub.checkpoint(f"hf:{R}@refs/pr/1")["hub"] == {
        "repo": R,
        "revision": "refs/pr/1",
        "commit": pr.name,
    }
    assert hub.checkpoint(f"hf:{R}")["hub"]["commit"] == main.name
    for revision, folder in (("refs/pr", "refs/refs/pr"), ("refs", "refs/refs")):
        with pytest.raises(UserError) as e:
            hub.checkpoint(f"hf:{R}@{revision}")
        text = refused(e, "train.checkpoint", f"hf:{R}@{revision}")
        assert f"({folder})" in text and text.endswith(" refs/pr/1")  # the folder, and the ref inside


@pytest.mark.parametrize(
    "content,shown",  # what the ref holds, and what the refusal shows of it
    [(b"", None), (b"\n", None), (b"abcdef0", "'abcdef0'"), (b"\xff\xfe\x00", "UnicodeDecodeError")],
)  # fmt: skip
def test_an_empty_or_garbled_ref_is_a_damaged_cache_named_with_its_repair(cache, content, shown):
    """An interrupted or disk-full write leaves refs/main empty: huggingface_hub then returns the
    snapshots/ folder itself, and the origin stage recorded commit 'snapshots' with whichever
    weights it found there. Now one line: the damaged ref and the command that writes it again."""
    add_snapshot(cache, R, neel_files(9))
    add_snapshot(cache, R, neel_files(10), ref="v1")
    for revision, command in ((None, f"hf download {R}"), ("v1", f"hf download {R} --revision v1")):
        ref = refs_of(cache) / (revision or "main")
        good = ref.read_bytes()
        ref.write_bytes(content)
        value = f"hf:{R}" + (f"@{revision}" if revision else "")
        with pytest.raises(UserError) as e:
            hub.checkpoint(value)
        text = refused(e, "train.checkpoint", value)
        assert f" {ref} " in text and f"`{command}`" in text and (shown is None or shown in text)
        ref.write_bytes(good)
        assert hub.checkpoint(value)["hub"]["commit"] == good.decode()  # repaired: read again


def test_a_ref_to_a_commit_the_cache_lacks_names_both(cache):
    add_snapshot(cache, R, neel_files(11))
    (refs_of(cache) / "main").write_text("f" * 40)
    with pytest.raises(UserError) as caught:
        hub.checkpoint(f"hf:{R}")
    text = refused(caught, "train.checkpoint", f"hf:{R}")
    assert "main" in text and "f" * 12 in text and R in text  # the ref, its commit, the repository
    with pytest.raises(UserError) as caught:
        hub.checkpoint(f"hf:{R}@{'e' * 40}")
    text = refused(caught, "train.checkpoint", f"hf:{R}@{'e' * 40}")
    assert f"`hf download {R} --revision {'e' * 40}`" in text


def test_a_tokenizer_that_cannot_encode_the_text_is_one_line_at_the_tokenizer_stage(cache, tmp_path):
    """The reason (tokenizers' own words) and the first line it fails on, naming
    data.tokenizer.pretrained: from the sample tried first, and from the whole text's encoding
    for a word past the sample."""
    from tokenizers import Tokenizer

    from pipeline.config import DataConfig, TextDataConfig, TokenizerConfig
    from pipeline.data import tokenizer

    words = ["in", "the", "beginning", "god", "created"]
    add_snapshot(cache, "org/words", {"tokenizer.json": word_level_tokenizer(words)})
    (tmp_path / "data").mkdir()
    common = ["in the beginning\n"] * 300
    pretrained = TokenizerConfig(pretrained="hf:org/words")
    data = DataConfig(
        source="text", dir=str(tmp_path / "data"), eval_fraction=0.3, text=TextDataConfig(glob="*.txt"),
        tokenizer=pretrained,
    )  # fmt: skip
    tok = Tokenizer.from_str(word_level_tokenizer(words).decode())
    with pytest.raises(Exception) as own:  # tokenizers' own reason
        tok.encode("heaven")
    assert tokenizer.SAMPLE_LINES < 300
    for lines, sampled in (([common[0], "god created the heaven\n", *common], True),
                           ([*common, "god created the heaven\n", *common], False)):  # fmt: skip
        text = "".join(lines)
        (tmp_path / "data" / "a.txt").write_text(text)
        with pytest.raises(UserError) as e:
            tokenizer.from_config(data, n_ctx=8)
        text_shown = refused(e, "data.tokenizer.pretrained", "hf:org/words")
        assert str(own.value).splitlines()[0] in text_shown and "'god created the heaven'" in text_shown
        cut = tokenizer.split_point(text, data.eval_fraction)
        if sampled:
            with pytest.raises(UserError) as e:
                tokenizer.require_encodes(tok, text, cut, "hf:org/words")
            refused(e, "data.tokenizer.pretrained", "hf:org/words")
        else:  # past the sample: only the whole text's encoding meets it
            tokenizer.require_encodes(tok, text, cut, "hf:org/words")
    # and a text it can encode goes through
    (tmp_path / "data" / "a.txt").write_text("in the beginning god created\n" * 200)
    result, manifest = tokenizer.from_config(data, n_ctx=8)
    assert manifest["pretrained"]["repo"] == "org/words" and set(result.tokens.tolist()) == {0, 1, 2, 3, 4}


def test_tokenizer_without_tokenizer_json_names_the_download(cache):
    add_snapshot(cache, "EleutherAI/gpt-neox-20b", {"config.json": b"{}"})
    with pytest.raises(UserError) as caught:
        hub.tokenizer_file("hf:EleutherAI/gpt-neox-20b")
    text = refused(caught, "data.tokenizer.pretrained", "hf:EleutherAI/gpt-neox-20b")
    assert f"`{hub.Spec('EleutherAI/gpt-neox-20b', None).download('tokenizer.json')}`" in text


def test_origin_stage_respects_hf_home_in_a_fresh_process(tmp_path):
    """HF_HOME (no HF_HUB_CACHE) puts the cache at $HF_HOME/hub; the origin stage finds it there."""
    home = tmp_path / "hf-home"
    state = tl_state(NEEL, seed=5)
    snap = add_snapshot(home / "hub", TINY_REPO, {"config.json": json.dumps(neel_config(NEEL)).encode(),
                                                  "model_final.pth": pth(state)})  # fmt: skip
    from pipeline import params

    cfg = params.compose(
        ["setup=synthetic", "train=load", f"train.checkpoint=hf:{TINY_REPO}"], conf_dir=ROOT / "conf"
    )
    (tmp_path / "params.yaml").write_text(params.dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {"HF_HOME": str(home)}
    env["PYTHONPATH"] = f"{socket_guard(tmp_path / 'guard')}{os.pathsep}{ROOT}"
    out = tmp_path / "origin"
    cmd = [sys.executable, "-m", "stages.origin", "--seed", "0", "--out", str(out), "--params", "params.yaml"]
    subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    chosen = json.loads((out / "origin.json").read_text())
    assert chosen["hub"]["commit"] == snap.name
    assert chosen["checkpoint"]["path"] == "model_final.pth"  # no cache location: a colleague's differs
    assert str(home) not in (out / "origin.json").read_text()
    # and a repository that is not there: one line, exit 2, the command to run
    cfg = params.compose(
        ["setup=synthetic", "train=load", "train.checkpoint=hf:org/absent"], conf_dir=ROOT / "conf"
    )
    (tmp_path / "params.yaml").write_text(params.dump(cfg))
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "`hf download org/absent`" in proc.stderr


def test_origin_stage_notes_a_checkpoint_named_while_training_from_scratch(tmp_path, capsys):
    """train.checkpoint=hf:... without train=load trains from scratch: origin.json says so, and the
    stage says why on one line of stderr (run under DVC, where params.yaml may have been edited)."""
    from pipeline import params
    from stages import origin as origin_stage

    cfg = params.compose(["setup=synthetic", f"train.checkpoint=hf:{TINY_REPO}"], conf_dir=ROOT / "conf")
    (tmp_path / "params.yaml").write_text(params.dump(cfg))
    argv = ["--params", str(tmp_path / "params.yaml"), "--seed", "0", "--out", str(tmp_path / "out")]
    assert origin_stage.main(argv) == 0
    assert json.loads((tmp_path / "out" / "origin.json").read_text()) == {"source": "train"}
    assert capsys.readouterr().err.splitlines() == notes(params.from_dict(cfg), "train")  # the schema's note


def test_the_socket_guard_refuses_connections(tmp_path):
    """The guard the end-to-end test relies on: a process under it cannot open a connection."""
    env = os.environ | {"PYTHONPATH": str(socket_guard(tmp_path / "guard"))}
    code = "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "OSError" in proc.stderr  # the guard's, not a timeout


@pytest.mark.interop
def test_neel_config_translates_as_transformer_lens_does(tmp_path):
    """TransformerLens's own `convert_neel_model_config`, reading the same fake cache offline,
    gives the fields our translation gives."""
    pytest.importorskip("transformer_lens")
    repo = "NeelNanda/Attn_Only_2L512W_C4_Code"  # a name TransformerLens knows
    raw = neel_config(NEEL)
    add_snapshot(tmp_path / "hub", repo, {"config.json": json.dumps(raw).encode()})
    code = (
        "import json; from transformer_lens.loading_from_pretrained import convert_neel_model_config as c; "
        f"print(json.dumps(c({repo!r})))"
    )
    env = os.environ | {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
                        "PYTHONPATH": str(socket_guard(tmp_path / "guard"))}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = tl_checkpoint.neel_translated(raw)
    for name in (*tl_checkpoint.TL_FIELDS, "attn_only"):
        assert ours.get(name) == theirs.get(name), name
    assert tl_checkpoint.from_tl_config(raw) == tl_checkpoint.from_tl_config(theirs)


@pytest.mark.slow
def test_dvc_exp_run_analyses_a_cached_model_with_its_own_tokenizer_offline(tmp_path, monkeypatch):
    """The acceptance run: `dvc exp run -S train=load -S train.checkpoint=hf:org/tiny-attn-only
    -S data.tokenizer.pretrained=hf:org/tiny-attn-only` on a slice of the KJV, every socket
    refused, gives heads.csv and scores.csv read through the model's own tokenizer. The experiment
    runs to the heads stage (its target): what follows it reads our own files whatever the model's
    source, and runs on a loaded checkpoint in test_interop's whole pipeline."""
    from dvc_repo import TINY_TEXT, dvc, make_repo, stages_run

    text, _ = corpus.read_corpus("kjv")
    tok = tokenizer_json(text[:20000], 300)
    state = tl_state(NEEL, seed=6)
    files = {
        "config.json": json.dumps(neel_config(NEEL)).encode(),
        "model_final.pth": pth(state),
        "tokenizer.json": tok,
    }
    snap = add_snapshot(tmp_path / "hub", TINY_REPO, files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("PYTHONPATH", str(socket_guard(tmp_path / "guard")))
    repo = make_repo(tmp_path / "repo", TINY_TEXT)
    spec = f"hf:{TINY_REPO}"
    done = dvc(
        repo,
        "exp",
        "run",
        "-S",
        "train=load",
        "-S",
        f"train.checkpoint={spec}",
        "-S",
        f"data.tokenizer.pretrained={spec}",
        "heads@0",
    )
    ran = ["tokenizer", "origin@0", "train@0", "weights@0", "composition@0", "heads@0"]
    assert sorted(stages_run(done)) == sorted(ran)
    out = repo / "outputs"
    manifest = json.loads((out / "tokenizer/manifest.json").read_text())
    assert manifest["pretrained"]["commit"] == snap.name and manifest["vocab"] <= 300
    assert json.loads((out / "origin/seed0/origin.json").read_text())["hub"]["commit"] == snap.name
    assert (out / "tokenizer/tokenizer.json").read_text() != "null\n"
    for table in ("heads/seed0/heads.csv", "composition/seed0/scores.csv"):
        assert len((out / table).read_text().splitlines()) > 1, table


KEY, VALUE = "train.checkpoint", f"hf:{TINY_REPO}"


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
    "names,named",  # the snapshot's files, and those of the kind tried first, which the refusal names
    [
        (["a.safetensors", "b.safetensors"], ["a.safetensors", "b.safetensors"]),
        (["a_final.pth", "b_final.pth", "c.pth"], ["a_final.pth", "b_final.pth"]),
        (["a.pth", "b.pt"], ["a.pth", "b.pt"]),
    ],
)
def test_several_weights_of_a_kind_are_refused_naming_the_repository_and_files(cache, names, named):
    with pytest.raises(UserError) as caught:
        chosen_file(cache, names)
    text = refused(caught, KEY, VALUE)
    assert TINY_REPO in text and f"({', '.join(named)})" in text


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
    text = refused(caught, KEY, VALUE)
    assert str(cache) in text and f"`{hub.Spec(TINY_REPO, None).download()}`" in text
    (snap / "model.safetensors").write_bytes(b"weights!")  # the download completed
    assert hub.snapshot(VALUE, KEY).path == snap


def test_a_snapshot_without_weights_is_refused_naming_its_commits_first_12_characters(cache):
    commit = "0123456789abcdef0123456789abcdef01234567"
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"}, commit=commit)
    with pytest.raises(UserError) as caught:
        hub.weights(hub.snapshot(VALUE, KEY), KEY, VALUE)
    text = refused(caught, KEY, VALUE)
    assert f" {commit[:12]} " in text and f"`{hub.Spec(TINY_REPO, None).download()}`" in text


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
    text = refused(caught, KEY, VALUE)
    assert f" {ref} " in text and f"({os.strerror(13)})" in text  # the ref, and the system's reason
    assert f"`{hub.Spec(TINY_REPO, None).download()}`" in text


# Each of hub.py's raises, on the smallest fake cache that reaches it: one line naming the key, the
# value, and what the user needs (the cache, a ref, a commit, files, the command that repairs it).
DOWNLOAD = f"`{hub.Spec(TINY_REPO, None).download()}`"


def refusal(value: str = VALUE, call=None, key: str = KEY) -> str:
    with pytest.raises(UserError) as caught:
        (call or (lambda: hub.snapshot(value, KEY)))()
    return refused(caught, key, value)


def test_the_download_command_names_the_file_and_the_revision():
    assert hub.Spec("org/a", None).download() == "hf download org/a"
    assert hub.Spec("org/a", "v1").download("config.json") == "hf download org/a config.json --revision v1"


def test_a_repository_absent_from_the_cache_is_refused_naming_the_cache_and_the_command(cache):
    text = refusal()
    assert f" {cache}" in text and DOWNLOAD in text


def test_an_empty_folder_of_refs_is_refused_without_naming_refs_inside(cache):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    (snap.parent.parent / "refs" / "v1").mkdir()
    value = f"hf:{TINY_REPO}@v1"
    text = refusal(value)
    assert "(refs/v1)" in text and "refs/v1/" not in text  # the folder, and no ref inside it


def test_a_folder_of_refs_names_at_most_four_refs_inside(cache):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    prs = snap.parent.parent / "refs" / "refs" / "pr"
    prs.mkdir(parents=True)
    for n in range(1, 6):
        (prs / str(n)).write_text(snap.name)
    value = f"hf:{TINY_REPO}@refs/pr"
    assert refusal(value).endswith(" refs/pr/1, refs/pr/2, refs/pr/3, refs/pr/4")  # not refs/pr/5


def test_a_revision_without_a_ref_is_refused_naming_the_cache_and_the_command(cache):
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    value = f"hf:{TINY_REPO}@v9"
    text = refusal(value)
    assert f" {cache}" in text and f"`{hub.Spec(TINY_REPO, 'v9').download()}`" in text


@pytest.mark.parametrize(
    "content,shown",
    [(b"", None), (b"0123456789abcdefghijklmnop", "'0123456789abcdefghij'")],
)
def test_a_garbled_ref_is_refused_whole_with_its_first_20_characters(cache, content, shown):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    ref = snap.parent.parent / "refs" / "main"
    ref.write_bytes(content)
    text = refusal()
    assert f" {ref} " in text and DOWNLOAD in text
    assert shown is None or (shown in text and content.decode() not in text)


def test_a_ref_to_a_commit_without_a_snapshot_names_the_commits_first_12_characters(cache):
    snap = add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    (snap.parent.parent / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    text = refusal()
    assert "0123456789ab" in text and "0123456789abc" not in text and f" {cache}" in text and DOWNLOAD in text


def test_a_commit_without_a_snapshot_is_named_by_its_first_12_characters(cache):
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"})
    commit = "abcdef0123456789abcdef0123456789abcdef01"
    value = f"hf:{TINY_REPO}@{commit}"
    text = refusal(value)
    assert f" {commit[:12]} " in text and f" {cache}" in text
    assert f"`{hub.Spec(TINY_REPO, commit).download()}`" in text


def test_several_weights_name_at_most_four_files(cache):
    names = [f"{c}.safetensors" for c in "abcde"]
    text = refusal(call=lambda: chosen_file(cache, names))
    assert f"({', '.join(names[:4])})" in text and names[4] not in text


def test_a_snapshot_without_config_json_is_refused_naming_the_known_repositories(cache):
    commit = "0123456789abcdef0123456789abcdef01234567"
    add_snapshot(cache, TINY_REPO, {"model.pth": b"x"}, commit=commit)
    text = refusal(call=lambda: hub.checkpoint(VALUE))
    assert f" {commit[:12]} " in text and f"`{hub.Spec(TINY_REPO, None).download('config.json')}`" in text
    assert all(known in text for known in hub.KNOWN)  # the repositories known without one


def test_a_snapshot_without_tokenizer_json_is_refused_naming_the_download(cache):
    commit = "0123456789abcdef0123456789abcdef01234567"
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}"}, commit=commit, ref="v1")
    value = f"hf:{TINY_REPO}@v1"
    text = refusal(value, lambda: hub.tokenizer_file(value), key="data.tokenizer.pretrained")
    assert f" {commit[:12]} " in text and f"`{hub.Spec(TINY_REPO, 'v1').download('tokenizer.json')}`" in text


def test_a_malformed_hub_name_is_refused_with_its_value():
    with pytest.raises(UserError) as caught:
        hub.require_hub_name("hf:no-slash", "train.checkpoint")
    assert caught.value.where == "train.checkpoint" and caught.value.value == "hf:no-slash"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("revision", ["main/..", "refs//pr", "v1/.hidden"])
def test_a_revision_with_an_empty_or_dotted_part_is_refused(revision):
    with pytest.raises(UserError) as caught:
        hub.require_hub_name(f"hf:org/name@{revision}", "train.checkpoint")
    assert caught.value.where == "train.checkpoint" and caught.value.value == f"hf:org/name@{revision}"
    assert "\n" not in str(caught.value) and repr(revision) in str(caught.value)
    assert hub.require_hub_name("hf:org/name@refs/pr/1", "train.checkpoint")["revision"] == "refs/pr/1"


def test_a_short_commit_hash_is_refused_naming_the_full_commit_the_cache_holds(cache):
    """The cache names its snapshots by full commit: `@abcdef0` is refused, naming the commit it
    abbreviates, never matched by prefix."""
    commit = "abcdef0123456789abcdef0123456789abcdef01"
    add_snapshot(cache, TINY_REPO, {"config.json": b"{}", "model.safetensors": b"w"}, commit=commit)
    text = refusal(f"hf:{TINY_REPO}@{commit[:7]}")
    assert commit in text
    assert hub.checkpoint(f"hf:{TINY_REPO}@{commit}")["hub"]["commit"] == commit
