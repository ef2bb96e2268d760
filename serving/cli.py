"""CLI wrappers for serving: `mlops serve` and `mlops serve-keys`."""

from __future__ import annotations

from pathlib import Path

import typer

ModelOpt = typer.Option(..., "--model", "-m", help="models:/name@alias, models:/name/version, runs:/<id>/model or a folder")
ProfileOpt = typer.Option(None, "--profile", help="a deployment profile YAML other than the model's own")
ForceOpt = typer.Option(False, "--force-profile", help="allow a profile other than the released one (labelled)")


def serve(
    model: str = ModelOpt,
    profile: Path | None = ProfileOpt,
    force_profile: bool = ForceOpt,
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8000, min=1, max=65535),
    name: str | None = typer.Option(None, help="model id the server answers to (default: from the ref)"),
    engine: str | None = typer.Option(None, "--engine", help="inference engine: hf, llamacpp, vllm (default: "
                                      "serve.engine)"),
    threads: int | None = typer.Option(None, min=1, help="compute threads (default: serve.threads, else cores - 1 "
                                       "or MLOPS_SERVE_THREADS)"),
    no_auth: bool = typer.Option(False, "--no-auth", help="serve without API keys (loopback hosts only, local use)"),
    keys_file: Path | None = typer.Option(None, help="hashed API keys file (default: serve.auth.keys_file)"),
    drain_timeout: float | None = typer.Option(None, min=0, help="seconds SIGTERM waits for running requests"),
    follow: bool = typer.Option(False, "--follow", help="follow the alias in --model: swap to the version the "
                                "registry's ledger moves it to (promotion, rollback)"),
    poll_interval: float = typer.Option(1.0, min=0.1, help="seconds between registry checks with --follow"),
    shadow: str | None = typer.Option(None, "--shadow", help="a candidate that answers a share of requests again in "
                                      "the background, e.g. models:/name@candidate (logged, never shown to users)"),
    shadow_share: float | None = typer.Option(None, "--shadow-share", min=0.0, max=1.0,
                                              help="share of requests shadowed (default: serve.shadow.share)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file (its serve: section)"),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides, e.g. serve.max_prompts=32",
                                                 show_default=False),
) -> None:
    """Serve a model version over an OpenAI-compatible API, configured by its deployment profile."""
    from mlops.cli_options import load
    from mlops.model_refs import resolve_model_ref
    from mlops.profile import ProfileMismatchError, check_template, choose_eval_profile, read_profile
    from serving.config import ServeConfig
    from serving.server import serve as run_server

    cfg = load(config, [*(overrides or []), *([f"serve.engine={engine}"] if engine else [])])
    serve_cfg = cfg.serve or ServeConfig()
    if drain_timeout is not None:
        serve_cfg = serve_cfg.model_copy(update={"drain_timeout": drain_timeout})
    if shadow_share is not None:
        serve_cfg = serve_cfg.model_copy(update={"shadow": serve_cfg.shadow.model_copy(update={"share": shadow_share})})
    follower = _follower(model, poll_interval) if follow else None
    resolved = resolve_model_ref(f"models:/{follower.model}/{follower.target()}" if follower else model)
    shadow_target, shadow_follower = _shadow(shadow, serve_cfg, follow, poll_interval) if shadow else (None, None)
    chosen, diffs = choose_eval_profile(resolved.profile(), read_profile(profile) if profile else None,
                                        force=force_profile)
    problem = check_template(chosen, resolved.hf_dir)
    if problem and not force_profile:
        raise ProfileMismatchError(f"{problem}. Fix: serve with the profile made for this tokenizer, or --force-profile.")
    keys = _key_store(serve_cfg, keys_file, no_auth or not serve_cfg.auth.enabled, host)
    for diff in diffs:
        typer.echo(f"warning: forced profile differs from the released one: {diff}", err=True)
    if serve_cfg.engine and serve_cfg.engine != chosen.engine:
        typer.echo(f"warning: serving on {serve_cfg.engine} although the deployment profile names {chosen.engine}: "
                   "answers may differ from the ones the version was evaluated on", err=True)
    served = name or resolved.served_name
    typer.echo(f"serving {served} ({resolved.hf_dir}) on http://{host}:{port}/v1, profile {chosen.profile_hash()}, "
               f"engine {serve_cfg.engine_for(chosen)}, auth {'OFF' if keys is None else f'on ({keys.count()} keys in {keys.path})'}", err=True)
    if follower:
        served = name or f"{follower.model}@{follower.alias}"
        typer.echo(f"following {follower.model}@{follower.alias} in the registry's ledger every {poll_interval:g} s",
                   err=True)
    if shadow_target:
        now = f"version {shadow_target.version} ({shadow_target.model_dir})" if shadow_target.version else \
            "no version yet (none holds the alias)"
        typer.echo(f"shadowing {serve_cfg.shadow.share:.0%} of requests on {now}"
                   f"{' following ' + shadow if shadow_follower else ''}", err=True)

    def on_app(app) -> None:
        if follower:
            follower.attach(app.state.slot, canary=app.state.canary).start()
        if shadow_follower:
            shadow_follower.attach(app.state.ctx.shadow.slot).start()

    if serve_cfg.engine_for(chosen) == "llamacpp" and resolved.kind == "version":
        from serving.engines.llamacpp.package import fetch_packaged

        quant = serve_cfg.engine_options("llamacpp", chosen)["quantization"]
        if (packaged := fetch_packaged(resolved, quant)) is not None:
            typer.echo(f"serving the packaged {packaged.name} of {resolved.ref}", err=True)
    code = run_server(resolved.hf_dir, chosen, host=host, port=port, model_name=served,
                      version=resolved.version or resolved.served_name, threads=threads, config=serve_cfg, keys=keys,
                      on_app=on_app, log_model=follower.model if follower else (resolved.name or resolved.served_name),
                      shadow=shadow_target)
    raise typer.Exit(code)


def _shadow(ref: str, serve_cfg, follow: bool, interval: float):
    """(ShadowTarget, a follower for its alias or None) for `--shadow`; `@candidate` is the newest candidate.
    With --follow, an alias nobody holds yet gives an empty target: the shadow starts when a version takes it."""
    from mlops.errors import ConfigError, NotFoundError
    from mlops.model_refs import MODELS_RE, resolve_model_ref
    from mlops.profile import ProfileMismatchError, check_template
    from registry.follow import Follower
    from serving.shadow import ShadowTarget

    if serve_cfg.shadow.share <= 0:
        raise ConfigError(f"--shadow {ref} needs a share of requests to shadow; serve.shadow.share is 0. Fix: pass "
                          "--shadow-share 0.2 (20% of requests).")
    if not serve_cfg.request_log.enabled:
        raise ConfigError("--shadow answers go only to the request log, and serve.request_log.enabled is false. Fix: "
                          "turn the request log on (serve.request_log.enabled=true) or serve without --shadow.")
    match, follower = MODELS_RE.match(ref.strip()), None
    if match and match["alias"]:
        follower = Follower(match["name"], match["alias"], slot=None, interval=interval)
        version = follower.target()
        if version is None and follow:
            # A permanent production server shadows whichever candidate comes next; until one does, nothing.
            return ShadowTarget(None, None, None), follower
        if version is None:
            raise NotFoundError(f"--shadow {ref}: no version of '{match['name']}' holds @{match['alias']} in the "
                                "registry's ledger. Fix: register a candidate, or name a version (models:/name/3).")
        ref = f"models:/{match['name']}/{version}"
    resolved = resolve_model_ref(ref)
    profile = resolved.profile()
    problem = check_template(profile, resolved.hf_dir)
    if problem:
        raise ProfileMismatchError(f"--shadow {ref}: {problem}. Fix: register the candidate with its own profile.")
    target = ShadowTarget(resolved.hf_dir, profile, resolved.version or resolved.served_name)
    return target, follower if follow else None


def _follower(model: str, interval: float):
    """A registry follower for `models:/<name>@<alias>`, refusing refs that name no alias or no version yet."""
    from mlops.errors import ConfigError, NotFoundError
    from mlops.model_refs import MODELS_RE
    from registry.follow import Follower

    match = MODELS_RE.match(model.strip())
    if not match or not match["alias"]:
        raise ConfigError(f"--follow needs --model models:/<name>@<alias>, got '{model}'. Fix: e.g. "
                          "--model models:/support-bot@production --follow.")
    follower = Follower(match["name"], match["alias"], slot=None, interval=interval)
    if follower.target() is None:
        raise NotFoundError(f"no version of '{match['name']}' holds @{match['alias']} in the registry's ledger. "
                            f"Fix: promote one first (`mlops registry promote {match['name']} <version> --to "
                            f"{match['alias']}`).")
    return follower


def _key_store(serve_cfg, keys_file: Path | None, no_auth: bool, host: str):
    """The API key store, or None for --no-auth (refused on a host other people can reach)."""
    from mlops.errors import ConfigError
    from serving.auth import KeyStore, keys_path

    if no_auth:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ConfigError(
                f"--no-auth serves every route without an API key, so it is only allowed on a loopback host; got "
                f"--host {host}. Fix: make a key with `mlops serve-keys add --name NAME` and serve with auth, or "
                "serve on --host 127.0.0.1 for local use."
            )
        banner = "!" * 78
        typer.echo(f"{banner}\n!! AUTH IS OFF (--no-auth): anyone who can reach {host} can use this model.\n"
                   f"!! Local use only. Production serving uses API keys (`mlops serve-keys add`).\n{banner}",
                   err=True)
        import logging

        logging.getLogger("mlops.serve").warning("AUTH IS OFF (--no-auth): every route is open on %s", host)
        return None
    extra = []
    if serve_cfg.auth.identities:
        from serving.auth import IdentityVerifier

        extra.append(IdentityVerifier())
    store = KeyStore(keys_path(keys_file or serve_cfg.auth.keys_file), extra=extra)
    if store.count() == 0 and not extra:
        raise ConfigError(
            f"no API keys in {store.path}, so no client could use this server. Fix: make one with "
            f"`mlops serve-keys add --name NAME{f' --keys-file {keys_file}' if keys_file else ''}` (the key is "
            "printed once), or pass --no-auth for local use on 127.0.0.1."
        )
    return store


keys_app = typer.Typer(help="Make, list and revoke the API keys `mlops serve` accepts.", no_args_is_help=True)
KeysFileOpt = typer.Option(None, "--keys-file", help="keys file (default: serve.auth.keys_file under the project home)")


def _keys_file(keys_file: Path | None) -> Path:
    from serving.auth import keys_path
    from serving.config import DEFAULT_KEYS_FILE

    return keys_path(keys_file or DEFAULT_KEYS_FILE)


@keys_app.command("add")
def keys_add(name: str = typer.Option(..., "--name", help="who or what uses the key"),
             keys_file: Path | None = KeysFileOpt) -> None:
    """Make a key; it is printed once, only its SHA-256 is stored."""
    from serving.auth import add_key

    path = _keys_file(keys_file)
    key, entry = add_key(path, name)
    typer.echo(f"key id {entry['id']} ({entry['name']}) added to {path}. Store it now; it is not shown again:", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list(keys_file: Path | None = KeysFileOpt) -> None:
    """Key ids, names, creation times and state (never the keys)."""
    import time

    from serving.auth import read_keys

    path = _keys_file(keys_file)
    keys = read_keys(path)
    if not keys:
        typer.echo(f"no keys in {path}; make one with `mlops serve-keys add --name NAME`")
    for entry in keys:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.get("created", 0)))
        typer.echo(f"{entry['id']}  {entry.get('name', ''):24} {created}  {'revoked' if entry.get('revoked') else 'active'}")


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="the key id shown by `list`"),
                keys_file: Path | None = KeysFileOpt) -> None:
    """Revoke a key; a running server stops accepting it within seconds."""
    from serving.auth import revoke_key

    entry = revoke_key(_keys_file(keys_file), key_id)
    typer.echo(f"revoked key {entry['id']} ({entry.get('name', '')})")


release_app = typer.Typer(help="Deployment artifacts of model versions.", no_args_is_help=True)


@release_app.command("package")
def release_package(
    model: str = typer.Argument(..., help="models:/<name>/<version> (or @alias)"),
    quant: str = typer.Option("q8_0", "--quant", help="GGUF type: f16, q8_0 (INT8, the default), q4_k_m (INT4)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Convert the version's weights to GGUF with llama.cpp's own tools, quantize, log the file on it."""
    import json

    from mlops.errors import ConfigError
    from mlops.profile import QUANTIZATIONS
    from serving.engines.llamacpp.package import package

    if quant not in QUANTIZATIONS:
        raise ConfigError(f"--quant {quant} is not a GGUF type this stack serves; use one of {', '.join(QUANTIZATIONS)}.")
    from mlops.identities import from_env

    done = package(model, quant, actor=from_env("register") if model.startswith("models:/") else None)
    if as_json:
        typer.echo(json.dumps({"ref": done.ref, "gguf": str(done.gguf), "sha256": done.sha256,
                               "quantization": done.quantization, "llamacpp_version": done.llamacpp_version,
                               "run_id": done.run_id}))
    else:
        typer.echo(f"{done.ref}: {done.gguf.name} ({done.gguf.stat().st_size / 2**20:.0f} MB, {done.quantization}, "
                   f"llama.cpp {done.llamacpp_version}) sha256 {done.sha256[:16]}, logged on run {done.run_id}")


@release_app.command("capacity")
def release_capacity(
    model: str = typer.Argument(..., help="models:/<name>/<version> (or @alias)"),
    levels: str = typer.Option("1,2,4,8,16,32", help="concurrency levels, comma-separated"),
    requests: int = typer.Option(16, min=1, help="streamed chats per level (at least the concurrency)"),
    max_tokens: int = typer.Option(32, min=1, help="new tokens per chat"),
    soak: float = typer.Option(60.0, min=1, help="seconds of soak at the knee"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Latency by concurrency to the knee, the throughput ceiling and a soak, stored on the version."""
    import json

    from serving.capacity import measure_capacity, render

    run_id, report = measure_capacity(model, levels=tuple(int(c) for c in levels.split(",") if c.strip()),
                                      requests=requests, max_tokens=max_tokens, soak_s=soak)
    typer.echo(json.dumps(report, indent=2) if as_json else f"{render(report)}\ncapacity run: {run_id}")


def register(app: typer.Typer) -> None:
    """Add `serve`, `serve-keys` and `release` to the top-level app."""
    app.command("serve")(serve)
    app.add_typer(keys_app, name="serve-keys")
    app.add_typer(release_app, name="release")
