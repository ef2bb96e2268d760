"""Model refs: `describe` a model from registry and run tags alone, or `materialize` it into a local HF folder.

A model ref is one of:
- `models:/<name>@<alias>`   a registered model version by alias (e.g. `models:/support-bot@production`)
- `models:/<name>/<version>` a registered model version by number
- `runs:/<run_id>/<path>`    a model logged by a run (training logs `runs:/<run>/model`)
- a local HF folder          (config.json inside), or a downloaded MLflow model folder

`describe` never downloads weights, so listing a thousand versions costs a thousand tag reads, not a thousand
downloads. A model's identity is its content id (`Tag.MODEL_ID`, a hash of weights, tokenizer and chat template,
written once when training ends): evals, gates and ledger entries key on it, so `runs:/<run>/model` and
`models:/bot/2` of the same weights are one model.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlops.errors import NotFoundError
from mlops.hf_folder import find_hf_folder
from mlops.lineage import Tag
from mlops.tracking import call, client, is_missing, unavailable

MODELS_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")
RUNS_RE = re.compile(r"^runs:/(?P<run>[0-9a-zA-Z]+)/(?P<path>.+)$")
REF_FORMS = "models:/<name>@<alias>, models:/<name>/<version>, runs:/<run_id>/model or a local HF folder"
CONTENT_ID_PREFIX = "mc-"


def model_content_id(hf_dir: Path | str) -> str:
    """Content id of an HF folder: weights, config, tokenizer and chat template; not the deployment profile,
    which is hashed on its own (a version is the pair)."""
    from mlops.files import file_manifest

    return content_id_of_files(file_manifest(hf_dir))


def content_id_of_files(files: dict[str, str]) -> str:
    """The content id of a folder from its file manifest (relative path -> sha256): so a verifier derives it
    from the file list a registration signs, without a byte of the files."""
    import hashlib
    import json

    from mlops.profile import PROFILE_FILE

    kept = {path: sha for path, sha in files.items() if path.rsplit("/", 1)[-1] != PROFILE_FILE}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return CONTENT_ID_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:20]


class _TagView:
    """What a model's tags say about it; shared by descriptions and materialized models."""

    ref: str
    kind: str
    name: str | None
    version: str | None
    run_id: str | None
    run_tags: dict[str, str]
    version_tags: dict[str, str]

    @property
    def tags(self) -> dict[str, str]:
        """Run tags overlaid by the version's own tags (the version is the more specific record)."""
        return {**self.run_tags, **self.version_tags}

    @property
    def content_id(self) -> str | None:
        return self.tags.get(Tag.MODEL_ID) or None

    @property
    def snapshot_id(self) -> str | None:
        return self.tags.get(Tag.SNAPSHOT_ID)

    @property
    def profile_hash(self) -> str | None:
        return self.tags.get(Tag.PROFILE_HASH)

    @property
    def lineage(self) -> dict[str, str]:
        return {k: v for k, v in self.tags.items() if k.startswith("mlops.")}

    @property
    def served_name(self) -> str:
        """The model id the server answers to."""
        if self.kind == "version":
            return f"{self.name}/{self.version}"
        if self.kind == "run":
            return f"run-{self.run_id}"
        return Path(self.ref).name


@dataclass(frozen=True)
class ModelDescription(_TagView):
    """A model as the registry and its run describe it; nothing downloaded."""

    ref: str
    kind: str  # "version", "run" or "folder"
    name: str | None = None
    version: str | None = None
    run_id: str | None = None
    run_tags: dict[str, str] = field(default_factory=dict)
    version_tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    source: str | None = None  # artifact URI of the model, or the folder

    def stored_profile(self):
        """The deployment profile stored with the version (its tag), or None."""
        import yaml

        from mlops.profile import DeploymentProfile

        text = self.tags.get(Tag.PROFILE)
        return DeploymentProfile.model_validate(yaml.safe_load(text)) if text else None


@dataclass(frozen=True)
class ResolvedModel(_TagView):
    """A model ref made concrete: its HF folder on local disk plus what the registry says about it."""

    ref: str
    hf_dir: Path
    kind: str
    name: str | None = None
    version: str | None = None
    run_id: str | None = None
    run_tags: dict[str, str] = field(default_factory=dict)
    version_tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    @functools.cached_property
    def key(self) -> str:
        """The model's identity: its recorded content id, or the hash of its folder (computed once)."""
        return self.content_id or model_content_id(self.hf_dir)

    def profile(self):
        from mlops.profile import load_profile

        return load_profile(self.hf_dir)


def _known_versions(c, name: str) -> str:
    try:
        model = c.get_registered_model(name)
        versions = c.search_model_versions(f"name='{name}'")
    except Exception as err:
        if is_missing(err):
            return f"There is no registered model '{name}'. "
        raise unavailable(err, f"registered model '{name}'") from err
    aliases = ", ".join(f"@{a}" for a in sorted(model.aliases or {})) or "none"
    numbers = ", ".join(sorted((str(v.version) for v in versions), key=int)) or "none"
    return f"Model '{name}' has versions {numbers} and aliases {aliases}. "


def _aliases_of(c, name: str, version: str) -> tuple[str, ...]:
    model = call(f"registered model '{name}'", c.get_registered_model, name)
    return tuple(sorted(a for a, v in (model.aliases or {}).items() if str(v) == str(version)))


def _run_tags(c, run_id: str | None) -> dict[str, str]:
    if not run_id:
        return {}
    run = call(f"run {run_id}", c.get_run, run_id, missing=f"run {run_id} does not exist")
    return dict(run.data.tags)


# --------------------------------------------------------------------------- describe and materialize


GOVERNED_ALIASES = ("production", "staging", "candidate")


def governed_version(name: str, alias: str) -> str | None:
    """The version a release alias names, as the registry's verified ledger says (MLflow's alias is only its
    display copy); None for an alias the registry does not govern, or when no registry is installed."""
    if alias not in GOVERNED_ALIASES:
        return None
    from mlops.stages import service

    resolve = service("release_version")
    return resolve(name, alias) if resolve else None


def describe(ref: str) -> ModelDescription:
    """What a ref names, from tags only; fails before any work when it names nothing."""
    ref = str(ref).strip()
    if match := MODELS_RE.match(ref):
        c = client()
        name = match["name"]
        what = f"model version '{ref}'"
        version = match["version"] or governed_version(name, match["alias"])
        try:
            mv = c.get_model_version(name, version) if version else c.get_model_version_by_alias(name, match["alias"])
        except Exception as err:
            if not is_missing(err):
                raise unavailable(err, what) from err
            raise NotFoundError(
                f"model ref '{ref}' does not exist ({str(err).splitlines()[0]}). {_known_versions(c, name)}"
                f"Fix: pass an existing {REF_FORMS}."
            ) from None
        aliases = tuple(sorted(getattr(mv, "aliases", None) or ())) or _aliases_of(c, name, mv.version)
        return ModelDescription(ref, "version", mv.name, str(mv.version), mv.run_id, _run_tags(c, mv.run_id),
                                dict(mv.tags), aliases, mv.source)
    if match := RUNS_RE.match(ref):
        c = client()
        missing = (f"model ref '{ref}' names run '{match['run']}', which does not exist. "
                   f"Fix: pass an existing {REF_FORMS}.")
        run = call(f"run {match['run']}", c.get_run, match["run"], missing=missing)
        return ModelDescription(ref, "run", run_id=run.info.run_id, run_tags=dict(run.data.tags), source=ref)
    folder = Path(ref).expanduser()
    if folder.is_dir():
        return ModelDescription(ref, "folder", source=str(folder.resolve()))
    raise NotFoundError(f"model ref '{ref}' is neither a model URI nor an HF model folder. Fix: pass {REF_FORMS}.")


def materialize(model: ModelDescription | str) -> ResolvedModel:
    """The model's HF folder on local disk (downloaded from the artifact store when it is remote); a folder
    that ships code (Python, native libraries, `auto_map`) is refused (mlops.model_safety)."""
    desc = describe(model) if isinstance(model, str) else model
    if desc.kind == "folder":
        try:
            hf_dir = find_hf_folder(Path(desc.source or desc.ref))
        except FileNotFoundError:
            raise NotFoundError(f"model ref '{desc.ref}' holds no HF model folder (config.json). "
                                f"Fix: pass {REF_FORMS}.") from None
    else:
        try:
            hf_dir = find_hf_folder(download(desc.source or desc.ref))
        except (FileNotFoundError, OSError) as err:
            raise NotFoundError(
                f"model ref '{desc.ref}': no model files at {desc.source} ({err}). Fix: pass the model's "
                "artifact path (usually runs:/<run_id>/model), or re-log the model if its artifacts were deleted."
            ) from None
        except Exception as err:
            if is_missing(err):
                raise NotFoundError(f"model ref '{desc.ref}': its artifacts at {desc.source} do not exist. "
                                    "Fix: re-log the model, or pass another version.") from None
            raise unavailable(err, f"the artifacts of '{desc.ref}'") from err
    from mlops.model_safety import require_no_code

    require_no_code(hf_dir)  # whoever trained it wrote the folder: refused here before anything loads it
    if desc.kind == "version":
        _verify_registered_bytes(desc.name, desc.version, hf_dir)
    return ResolvedModel(desc.ref, hf_dir, desc.kind, desc.name, desc.version, desc.run_id, dict(desc.run_tags),
                         dict(desc.version_tags), desc.aliases)


def _verify_registered_bytes(name: str, version: str, hf_dir: Path) -> None:
    """A registered version's files must be the bytes its signed registration names (the registry checks; the
    core only asks), every time it is materialized: MLflow's source and artifacts can be rewritten by any client."""
    from mlops.stages import service

    verify = service("verify_model_files")
    if verify is not None:
        verify(name, version, hf_dir)


def resolve_model_ref(ref: str) -> ResolvedModel:
    """describe + materialize: a ref that does not exist fails before any download."""
    return materialize(describe(ref))


def model_key(model: ModelDescription | ResolvedModel) -> str:
    """The content id, materializing only a model that has none recorded (logged before content ids existed)."""
    if isinstance(model, ResolvedModel):
        return model.key
    return model.content_id or materialize(model).key


def with_tags(model, **version_tags: str):
    """A copy of a description or resolved model with extra version tags (after tagging it in the store)."""
    return replace(model, version_tags={**model.version_tags, **version_tags})


def download(uri: str) -> Path:
    """A local path for an artifact URI: artifacts on this file system are returned in place; remote ones are
    copied once into the artifact cache (`.mlops/cache/artifacts`) and found there by every later call, so
    serving, registering and evaluating a model never leave a copy of it behind in a temporary folder."""
    in_place = _logged_model_in_place(uri) or _run_artifact_in_place(uri)
    if in_place is not None and in_place.exists():
        return in_place
    return _cached_download(uri)


def _run_artifact_in_place(uri: str) -> Path | None:
    """`runs:/<run>/<path>` on this file system: the run's own artifact, else (as MLflow 3 resolves it) the
    logged model named by the path's first part that the run logged."""
    from mlops.run_store import local_artifact
    from mlops.tracking import tracking_uri

    match = RUNS_RE.match(uri)
    if not match:
        return None
    path = match["path"].strip("/")
    own = local_artifact(match["run"], path)
    if own is None or own.exists():
        return own
    name, _, rest = path.partition("/")
    model_id = _logged_model_of_run(tracking_uri(), match["run"], name)
    if model_id is None:
        raise FileNotFoundError(f"run {match['run']} has no artifact or logged model '{path}'. Fix: check the "
                                f"run id and the path (`mlflow artifacts list --run-id {match['run']}` lists them).")
    return _logged_model_in_place(f"models:/{model_id}/{rest}".rstrip("/"))


_RUN_MODELS: dict[tuple[str, str, str], str] = {}  # a run's logged model of a name never changes once logged


def _logged_model_of_run(store: str, run_id: str, name: str) -> str | None:
    if "'" in name:  # not a name MLflow's filter can quote, nor one this project logs
        return None
    if (store, run_id, name) not in _RUN_MODELS:
        c = client()
        run = call(f"run {run_id}", c.get_run, run_id, missing=f"run {run_id} does not exist")
        query = f"name = '{name}' AND source_run_id = '{run_id}'"
        found = call(f"logged models of run {run_id}",
                     lambda: c.search_logged_models(experiment_ids=[run.info.experiment_id], filter_string=query))
        model_id = next((m.model_id for m in found if m.source_run_id == run_id), None)
        if model_id is None:
            return None
        _RUN_MODELS[(store, run_id, name)] = model_id
    return _RUN_MODELS[(store, run_id, name)]


def _cached_download(uri: str) -> Path:
    """Logged models and finished runs' artifacts do not change: one copy per store and URI, written whole
    (downloaded beside the cache entry, then renamed into place) so a killed download is never taken for one."""
    import hashlib
    import shutil
    import tempfile

    import mlflow

    from mlops.paths import artifact_cache_dir
    from mlops.tracking import use_store

    # A version's source is a logged model's `models:/m-<id>` URI. MLflow 3.17 looks that id up through the
    # process-wide tracking URI, ignoring the `tracking_uri` argument: unset, it reads (and creates) ./mlflow.db.
    store = use_store()
    entry = artifact_cache_dir() / hashlib.sha256(f"{store}\n{uri}".encode()).hexdigest()[:24]
    if (entry / _CACHE_DONE).is_file():
        return entry / (entry / _CACHE_DONE).read_text(encoding="utf-8")
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{entry.name}.partial-", dir=entry.parent))
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, tracking_uri=store, dst_path=str(partial)))
        if not local.is_relative_to(partial):  # MLflow answered with the artifact in place
            return local
        (partial / _CACHE_DONE).write_text(local.relative_to(partial).as_posix(), encoding="utf-8")
        try:
            partial.rename(entry)
        except OSError:  # another process finished the same download first: theirs is as good
            if not (entry / _CACHE_DONE).is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return entry / (entry / _CACHE_DONE).read_text(encoding="utf-8")


_CACHE_DONE = ".downloaded"  # holds the artifact's path inside its cache entry


def _logged_model_in_place(uri: str) -> Path | None:
    """The folder of a logged model (`models:/m-<id>[/path]`) whose artifacts live on this file system, where
    MLflow's download would return it in place anyway; None for anything else."""
    from urllib.parse import unquote, urlsplit

    from mlops.tracking import tracking_uri

    if not uri.startswith("models:/m-"):
        return None
    model_id, _, sub = uri.removeprefix("models:/").partition("/")
    location = _logged_model_location(tracking_uri(), model_id)
    parts = urlsplit(location)
    if not location or parts.scheme not in ("", "file"):
        return None
    root = Path(unquote(parts.path) if parts.scheme else location)
    return root / sub if sub else root


@functools.lru_cache(maxsize=1024)
def _logged_model_location(store: str, model_id: str) -> str:
    """A logged model's artifact location never changes once it exists: asked of the store once per process."""
    try:
        return client().get_logged_model(model_id).artifact_location or ""
    except Exception:  # noqa: BLE001 - MLflow's own download path reports what is wrong
        return ""


# --------------------------------------------------------------------------- version tags and history


def set_version_tags(model, tags: dict) -> bool:
    """Tag a model version (gate results, contamination, eval runs). False for refs that are not versions.
    Governed tags (`registry.*`, display copies of the ledger) are written only by the registry's one door."""
    from mlops.errors import MLOpsError

    governed = sorted(k for k in tags if str(k).startswith("registry."))
    if governed:
        raise MLOpsError(f"tags {', '.join(governed)} are the registry's display copies of its ledger and are "
                         "written only by registry acts. Fix: use `mlops registry ...` to change a version's stage.")
    if model.kind != "version":
        return False
    c = client()
    for key, value in tags.items():
        call(f"model version {model.name}/{model.version}", c.set_model_version_tag, model.name, model.version,
             str(key), str(value)[:5000])
    return True


def previous_versions(model, tag: str, value: str, limit: int) -> list[str]:
    """Refs of earlier versions of the same model whose `tag` equals `value`, newest first."""
    if model.kind != "version" or limit <= 0:
        return []
    versions = call(f"versions of '{model.name}'", client().search_model_versions, f"name='{model.name}'")
    older = [v for v in versions if int(v.version) < int(model.version) and v.tags.get(tag) == value]
    older.sort(key=lambda v: int(v.version), reverse=True)
    return [f"models:/{model.name}/{v.version}" for v in older[:limit]]


def require_ref(ref: str | None, what: str) -> str:
    from mlops.errors import MLOpsError

    if not ref or not str(ref).strip():
        raise MLOpsError(f"no {what} model given. Fix: pass {REF_FORMS}.")
    return str(ref).strip()
