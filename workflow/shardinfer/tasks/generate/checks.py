"""What task generate refuses, on either engine: a model folder without a generation head (by its
config's class names when settings are checked, by the loaded model at load), a prompt and
max_new_tokens beyond the model's positions (and none given: task seq2seq requires it the same way),
and `generate:` keys that do not go together. The task (`shardinfer.tasks.generate.task`) calls them;
the messages name the keys and what is allowed."""

from __future__ import annotations

from collections.abc import Collection

from shardinfer.core.errors import UserError
from shardinfer.input.formats.openai_batch import NAME as BATCH_FORMAT
from shardinfer.settings.config import ModelSettings, Settings
from shardinfer.tasks.classify import untrained_head
from shardinfer.tasks.generate.params import lines_carry_parameters
from shardinfer.tasks.text import model_length_limit

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "WithLMHead", "ForConditionalGeneration",
                   "GenerationDecoder")  # class names with a generation head


def names_a_generator(architectures: list[str], known: Collection[str] = ()) -> bool:
    """Whether a model config's `architectures` name one with a generation head: by the suffixes of
    such class names (when the config is checked, without transformers), or by name in `known`
    (at load: transformers' causal LM classes). A config that names none is not refused here."""
    return not architectures or any(name in known or name.endswith(CAUSAL_SUFFIXES) for name in architectures)


def check_max_new_tokens(model: ModelSettings) -> None:
    """model.max_new_tokens given, for a task that generates (generate, seq2seq): the schema's default
    is null, as the other tasks have no use for it."""
    if model.max_new_tokens is None or model.max_new_tokens < 1:
        raise UserError(f"model.max_new_tokens must be an integer >= 1 for task {model.task} (tokens to generate at "
                        f"most per row); got {model.max_new_tokens!r}")


def check_positions(model: ModelSettings) -> None:
    """A prompt of max_length and max_new_tokens generated after it fit the model's positions."""
    limit = model_length_limit(model.path)
    if limit is not None and model.max_new_tokens >= limit:  # no max_length would help: say what would
        room = ""
        if model.max_length < limit:
            room = f"; use at most {limit - model.max_length} with max_length {model.max_length}"
        raise UserError(f"model.max_new_tokens {model.max_new_tokens} leaves no room for a prompt within the model's "
                        f"limit of {limit} positions{room}")
    if limit is not None and model.max_length + model.max_new_tokens > limit:
        raise UserError(f"model.max_length {model.max_length} + model.max_new_tokens {model.max_new_tokens} is above "
                        f"the model's limit of {limit} positions; lower max_length to {limit - model.max_new_tokens} "
                        f"or less, or max_new_tokens to {limit - model.max_length} or less")


def check_generate_section(settings: Settings) -> None:
    """What the `generate:` keys refuse together, on either engine."""
    options = settings.task_settings
    if lines_carry_parameters(settings):
        per_line = [key for key, unset in (("n", 1), ("logprobs", None), ("structured", None), ("stop", ()))
                    if options.get(key) != unset]
        if per_line or settings.evaluate.label_column is not None:
            key = f"generate.{per_line[0]}" if per_line else "evaluate.label_column"
            raise UserError(f"{key}: with input.format {BATCH_FORMAT} each line sets its own n, logprobs, stop and "
                            f"response_format (and may ask for several completions); leave {key} out")
    if options.n > 1 and not options.do_sample:
        raise UserError(f"generate.n {options.n} needs generate.do_sample: true (greedy decoding gives one completion "
                        "per prompt); set do_sample: true or n: 1")
    if options.n > 1 and settings.evaluate.label_column is not None:
        raise UserError(f"evaluate compares one generated text per row with its gold text; with generate.n {options.n} "
                        "leave evaluate.label_column out (or set n: 1)")


def not_a_generator(loaded) -> str | None:
    """Why the loaded model cannot generate text, or None. An encoder folder (BertModel,
    BertForMaskedLM) loads as BertLMHeadModel, with a random head or bidirectional attention."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    named = list(getattr(loaded.model.config, "architectures", None) or [])
    known = {*MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values(), *MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values()}
    if not names_a_generator(named, known):
        return f"it holds {', '.join(named)}, not a causal language model (…ForCausalLM) with a generation head"
    missing = untrained_head(loaded)
    if missing:
        more = " …" if len(missing) > 4 else ""
        return f"weights {', '.join(missing[:4])}{more} are missing from it (they would be random)"
    return None
