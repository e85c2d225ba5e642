"""What `<task>.engine: server` is refused when the Snakefile loads, before any job: a URL and a
key it can use, a server that answers and serves the model with room for the rows (generate:
`max_length + max_new_tokens`; embed: `max_length`), and nothing asked that the server's dialect
cannot pass (`endpoint.Served`). Also what the other engines are refused of `<task>.server`.
Torch-free.
"""

from __future__ import annotations

from shardinfer.core.errors import UserError
from shardinfer.engines.server.endpoint import Served, ServerOptions, client, probe, served
from shardinfer.settings.schema import defaults


def check_server_settings(settings) -> Served:
    """Before any job: the section read, the key's variable set, no image or adapter (the server
    holds the model), the server asked what it serves, and the settings against its answer."""
    task, model = settings.model.task, settings.model
    options = ServerOptions.of(settings.task_settings, task)
    options.headers()
    if settings.input.image_columns:
        raise UserError(f"input.image_column `{settings.input.image_columns[0]}`: {task}.engine server sends "
                        "prompts as token ids or text, without images; use generate.engine vllm or transformers")
    if model.adapter is not None:
        raise UserError(f"model.adapter `{model.adapter}`: {task}.engine server runs the model the server serves; "
                        f"serve the adapter there (vLLM: --lora-modules name=path) and name it in "
                        f"{options.setting}.model")
    if task == "embed":
        check_pooling(settings.task_settings, options)
    found = served(options)
    needed, what = ((model.max_length, "model.max_length") if task == "embed" else
                    (model.max_length + model.max_new_tokens, "model.max_length + model.max_new_tokens"))
    if found.max_model_len is not None and found.max_model_len < needed:
        raise UserError(f"{options.setting}: the server's model {found.model!r} takes {found.max_model_len} tokens "
                        f"(max_model_len), fewer than {what} = {needed}; start it with --max-model-len {needed} or "
                        "more, or lower model.max_length")
    if task == "generate":
        check_dialect(settings.task_settings, found, options)
        if settings.task_settings.structured:
            check_structured(settings.task_settings.structured, found, options)
    return found


def check_pooling(section, options: ServerOptions) -> None:
    """The server pools as it was started; a pooling asked of the workflow would not reach it."""
    default = defaults("embed")["pooling"]
    if section.pooling != default:
        raise UserError(f"embed.pooling is {section.pooling!r}, but with embed.engine server the server pools as it "
                        f"was started (vLLM: --pooler-config '{{\"pooling_type\": \"{section.pooling.upper()}\"}}'); "
                        f"start it so and leave embed.pooling at {default!r}")


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
    """`<task>.server` set while another engine runs the task: the rows would not go to that server."""
    task, section = settings.model.task, settings.task_settings
    given = section.get("server") or {}
    if given and given != defaults(task)["server"] and section.get("engine") != "server":
        raise UserError(f"{task}.server is set, but {task}.engine is {section.get('engine')}: set {task}.engine: "
                        f"server to send the rows to {given.get('url') or 'a server'}, or leave {task}.server out")
