"""What `generate.engine: server` is refused when the Snakefile loads, before any job: a URL and a
key it can use, a server that answers and serves the model with room for `max_length +
max_new_tokens`, and nothing asked that the server's dialect cannot pass (`endpoint.Served`).
Also what the other engines are refused of `generate.server`. Torch-free.
"""

from __future__ import annotations

from shardinfer.core.errors import UserError
from shardinfer.engines.server.endpoint import SETTING, Served, ServerOptions, client, probe, served
from shardinfer.settings.schema import defaults


def check_server_settings(settings) -> Served:
    """Before any job: the section read, the key's variable set, no image or adapter (the server
    holds the model), the server asked what it serves, and the settings against its answer."""
    options = ServerOptions.of(settings.task_settings)
    options.headers()
    model = settings.model
    if settings.input.image_columns:
        raise UserError(f"input.image_column `{settings.input.image_columns[0]}`: generate.engine server sends "
                        "prompts as token ids or text, without images; use generate.engine vllm or transformers")
    if model.adapter is not None:
        raise UserError(f"model.adapter `{model.adapter}`: generate.engine server runs the model the server serves; "
                        f"serve the adapter there (vLLM: --lora-modules name=path) and name it in {SETTING}.model")
    found = served(options)
    needed = model.max_length + model.max_new_tokens
    if found.max_model_len is not None and found.max_model_len < needed:
        raise UserError(f"{SETTING}: the server's model {found.model!r} takes {found.max_model_len} tokens "
                        f"(max_model_len), fewer than model.max_length + model.max_new_tokens = {needed}; start it "
                        f"with --max-model-len {needed} or more, or lower model.max_length")
    check_dialect(settings.task_settings, found, options)
    if settings.task_settings.structured:
        check_structured(settings.task_settings.structured, found, options)
    return found


def check_structured(spec: dict, found: Served, options: ServerOptions) -> None:
    """`generate.structured` tried on one token: a spec the server's grammar backend refuses would
    refuse every row."""
    from shardinfer.engines.server.replies import structured_outputs

    with client(options, min(options.timeout_s, 60.0)) as http:
        probe(http, options, found.model, found.dialect, {"structured_outputs": structured_outputs(spec)})


def check_dialect(section, found: Served, options: ServerOptions) -> None:
    """What only a vLLM server returns: log-probabilities by token id and vLLM's structured output."""
    if found.dialect == "vllm":
        return
    for key, value in (("logprobs", section.logprobs), ("structured", section.structured)):
        if value is not None:
            raise UserError(f"generate.{key} is set, but the server at {options.url} is not vLLM (its model's "
                            f"owned_by: {found.entry.get('owned_by')!r}): generate.engine server passes "
                            f"generate.{key} to a vLLM server only; leave it out, or use a vLLM server")


def check_server_unused(settings) -> None:
    """generate.server set while another engine runs the task: the rows would not go to that server."""
    section = settings.task_settings
    given = section.get("server") or {}
    if given and given != defaults("generate")["server"] and section.get("engine") != "server":
        raise UserError(f"{SETTING} is set, but generate.engine is {section.get('engine')}: set generate.engine: "
                        f"server to send the rows to {given.get('url') or 'a server'}, or leave {SETTING} out")
