"""Check `dvc exp run -S key=value` overrides against our schema, with one-line errors.

`dvc exp run` composes conf/ into params.yaml itself (hydra.enabled), in its own
process, and prints Hydra's exceptions over several lines. Before composing, DVC
imports every module under `hydra_plugins/` in its `hydra.plugins_path` (default:
the repository root), so DVC loads this module. It wraps Hydra's config loading
for this repository's conf/ only: the composed config is validated by
`pipeline.params.from_dict` (unknown key, wrong type, impossible value) and its inputs
by `pipeline.params.require_inputs` (data.dir and the files under it, a local checkpoint)
and `pipeline.data.corpus.require_package` (a named corpus's pinned package), and any
failure is raised as one line naming the key, before params.yaml is written: a stage would
refuse them too, but only after DVC had changed params.yaml.
Before DVC writes it, the workspace's run is kept for `python -m pipeline.restore`
(`pipeline.restore.keep`): what brings it back if a stage of the experiment fails.

This patches a Hydra internal (`ConfigLoaderImpl.load_configuration`, hydra-core
1.3, pinned in pyproject.toml); tests/test_params.py runs the real `dvc exp run`
to catch a change there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.errors import ConfigCompositionException

CONF_DIR = (Path(__file__).resolve().parent.parent / "conf").as_posix()
_load_configuration = ConfigLoaderImpl.load_configuration


def _is_ours(loader: ConfigLoaderImpl) -> bool:
    return any(
        element.path.removeprefix("file://").rstrip("/") == CONF_DIR
        for element in loader.config_search_path.get_path()
        if element.path
    )


def _composing() -> bool:
    """`pipeline.params.compose` is running in this process (as `pipeline.params`, or as
    `__main__` under `python -m pipeline.params`): then the values alone are checked here."""
    modules = (sys.modules.get("pipeline.params"), sys.modules.get("__main__"))
    return any(getattr(m, "composing", False) is True for m in modules)


def load_configuration(self: ConfigLoaderImpl, *args, **kwargs):
    if not _is_ours(self):
        return _load_configuration(self, *args, **kwargs)
    from omegaconf import OmegaConf

    # DVC's process has no repository on sys.path, and only `attn_circuits` is installed (perhaps
    # from another checkout): the schema checked is this checkout's pipeline/, beside conf/.
    root = str(Path(CONF_DIR).parent)
    if root not in sys.path:
        sys.path.append(root)
    from pipeline import config, params, restore
    from pipeline.data import corpus
    from pipeline.errors import UserError

    try:
        overrides = kwargs.get("overrides", args[1] if len(args) > 1 else ())
        params.check_group_overrides(overrides or (), CONF_DIR)  # `model=4`: Hydra would name no key
        cfg = _load_configuration(self, *args, **kwargs)
        composed = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
        checked = params.from_dict(OmegaConf.to_container(composed, resolve=True), source="override")
        if not _composing():  # DVC's composition (pipeline.params checks its own before writing)
            params.require_inputs(checked, Path(CONF_DIR).parent)  # a path, a checkpoint
            if checked.data.source == "text" and checked.data.text.corpus is not None:
                corpus.require_package(checked.data.text.corpus)  # torch-free: metadata only
            for line in config.notes(checked):  # a checkpoint while training from scratch
                print(line, file=sys.stderr)
            try:
                restore.keep(Path(CONF_DIR).parent)
            except restore.KEEP_ERRORS as e:  # the experiment runs; only its way back is lost
                print(
                    f"note: the workspace's run was not kept for python -m pipeline.restore: {e}",
                    file=sys.stderr,
                )
    except UserError as e:
        raise ConfigCompositionException(str(e)) from None
    except (ConfigCompositionException, ValueError, TypeError, KeyError) as e:  # Hydra's failures of any
        # kind: some are plain Python errors (a group set to a list of numbers: TypeError)
        raise ConfigCompositionException(str(params.hydra_error(e))) from None
    return cfg


if not getattr(ConfigLoaderImpl.load_configuration, "attn_circuits", False):
    load_configuration.attn_circuits = True  # type: ignore[attr-defined]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
